from omni_core.testing import PluginConformance


class TestRocmPluginConformance(PluginConformance):
    plugin_name = "rocm"
