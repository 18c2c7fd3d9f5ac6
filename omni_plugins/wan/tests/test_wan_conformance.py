from omni_core.testing import PluginConformance


class TestWanPluginConformance(PluginConformance):
    plugin_name = "wan"
