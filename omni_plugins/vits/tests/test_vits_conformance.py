from omni_core.testing import PluginConformance


class TestVitsPluginConformance(PluginConformance):
    plugin_name = "vits"
