from omni_core.testing import PluginConformance


class TestXpuPluginConformance(PluginConformance):
    plugin_name = "xpu"
