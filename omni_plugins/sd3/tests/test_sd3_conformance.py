from omni_core.testing import PluginConformance


class TestSD3PluginConformance(PluginConformance):
    plugin_name = "sd3"
