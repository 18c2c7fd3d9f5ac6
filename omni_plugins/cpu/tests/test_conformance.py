from omni_core.testing import PluginConformance


class TestCpuPluginConformance(PluginConformance):
    plugin_name = "cpu"
