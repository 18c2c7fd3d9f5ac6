"""omni's contract checks, run against the installed plugin (``pip install -e omni_plugins/bark`` first)."""

from omni_core.testing import PluginConformance


class TestBarkConformance(PluginConformance):
    plugin_name = "bark"
