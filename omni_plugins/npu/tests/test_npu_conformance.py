from omni_core.testing import PluginConformance


class TestNpuPluginConformance(PluginConformance):
    plugin_name = "npu"
