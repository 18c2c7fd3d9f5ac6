from omni_core.testing import PluginConformance


class TestPiperPluginConformance(PluginConformance):
    plugin_name = "piper"
