from omni_core.testing import PluginConformance


class TestSanaPluginConformance(PluginConformance):
    plugin_name = "sana"
