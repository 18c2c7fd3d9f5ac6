"""The inheritable test class of the conformance kit."""

from __future__ import annotations

from typing import ClassVar

import pytest

from omni_core.testing import checks


class PluginConformance:
    """Subclass as ``TestSomething`` and set :attr:`plugin_name`; pytest runs the checks."""

    #: the plugin's entry point name in the ``omni.plugins`` group
    plugin_name: ClassVar[str] = ""

    def _name(self) -> str:
        if not self.plugin_name:
            pytest.fail(f"{type(self).__name__} must set plugin_name to the plugin's entry point name")
        return self.plugin_name

    def _check(self, problems: list[str]) -> None:
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)

    def test_manifest_is_valid_and_compatible(self, omni_isolated: object) -> None:
        self._check(checks.check_manifest(self._name()))

    def test_registrations_match_manifest(self, omni_isolated: object) -> None:
        self._check(checks.check_registration(self._name()))

    def test_lazy_references_resolve(self, omni_isolated: object) -> None:
        self._check(checks.check_lazy_refs(self._name()))

    def test_discovery_is_import_light(self, omni_isolated: object) -> None:
        self._check(checks.check_import_light(self._name()))

    def test_declared_capabilities_hold(self, omni_isolated: object) -> None:
        self._check(checks.check_capabilities(self._name()))

    def test_no_name_overlaps(self, omni_isolated: object) -> None:
        self._check(checks.check_no_overlaps(self._name()))
