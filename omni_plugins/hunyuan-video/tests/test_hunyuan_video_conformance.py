from omni_core.testing import PluginConformance


class TestHunyuanVideoPluginConformance(PluginConformance):
    plugin_name = "hunyuan_video"
