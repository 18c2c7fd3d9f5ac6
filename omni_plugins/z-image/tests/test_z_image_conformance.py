from omni_core.testing import PluginConformance


class TestZImagePluginConformance(PluginConformance):
    plugin_name = "z_image"
