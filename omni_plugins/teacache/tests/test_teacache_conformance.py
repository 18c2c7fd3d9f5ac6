"""omni's contract checks, run against the installed plugin (``pip install -e omni_plugins/teacache`` first)."""

from omni_core.testing import PluginConformance


class TestTeaCacheConformance(PluginConformance):
    plugin_name = "teacache"
