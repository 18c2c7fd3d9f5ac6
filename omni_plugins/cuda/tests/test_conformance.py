from omni_core.testing import PluginConformance


class TestCudaPluginConformance(PluginConformance):
    plugin_name = "cuda"
