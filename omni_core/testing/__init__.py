"""The conformance kit: contract tests any omni plugin runs against itself.

Enable it in the plugin's test suite and subclass :class:`PluginConformance`::

    # tests/conftest.py
    pytest_plugins = ["omni_core.testing"]

    # tests/test_conformance.py
    from omni_core.testing import PluginConformance

    class TestConformance(PluginConformance):
        plugin_name = "my-plugin"          # the entry point name

The inherited tests check, against the *installed* plugin (``pip install -e .`` first):
the manifest parses and its API range admits this core; the hooks register exactly what
the manifest declares; every lazy reference resolves; discovery and registration import no
torch and none of the referenced modules; each declared capability holds for its kind; and
no name overlaps another installed plugin. The same checks are available as plain functions
(:func:`check_plugin`) that return problems instead of failing.

Attention backends compare against :func:`reference_attention`, the one reference (additive
masks, fully masked rows give zeros as torch's SDPA does on the CPU).

Registries for a test, without installing anything: register by hand (``registrar =
ModelRegistrar(Provider(...)); registrar.register(...)``), then ``plugin_set_of(registrar.offers())``
(or :func:`build_registries`), the same builder ``load_plugins`` uses.

A second plugin beside yours (a fixture of your tests): :func:`install_plugin` pip-installs its
source tree into a site directory of the test's own; :func:`plugin_site` does it once per version
of the plugin's files and puts the site on ``sys.path``.

Connectors: :mod:`omni_core.testing.connectors` has seeded payload cases, ``assert_same`` and
``ConnectorProcess``, an instance of the connector in a spawned process driven by the test.

Executors: :mod:`omni_core.testing.executors` has the kit's two-stage pipeline (plain Python,
no torch), ``kit_pipeline`` to run it on an executor with its options and ``kit_request`` to
send a request and see where each stage ran.

Fixtures: ``omni_isolated`` gives a test a private config and cache directory and clears
every ``OMNI_*`` filter variable, so the user's own settings never leak into a test.
"""

from __future__ import annotations

from omni_core.attention.reference import reference_attention, reference_attention_varlen
from omni_core.plugins import build_registries, plugin_set_of
from omni_core.testing.checks import (
    CAPABILITY_CHECKS,
    check_capabilities,
    check_import_light,
    check_lazy_refs,
    check_manifest,
    check_no_overlaps,
    check_plugin,
    check_registration,
    isolated_settings,
)
from omni_core.testing.fixtures import omni_isolated
from omni_core.testing.install import install_plugin, plugin_site
from omni_core.testing.stages import run_stage_engine
from omni_core.testing.suite import PluginConformance

__all__ = [
    "CAPABILITY_CHECKS",
    "PluginConformance",
    "build_registries",
    "check_capabilities",
    "check_import_light",
    "check_lazy_refs",
    "check_manifest",
    "check_no_overlaps",
    "check_plugin",
    "check_registration",
    "install_plugin",
    "isolated_settings",
    "omni_isolated",
    "plugin_set_of",
    "plugin_site",
    "reference_attention",
    "reference_attention_varlen",
    "run_stage_engine",
]
