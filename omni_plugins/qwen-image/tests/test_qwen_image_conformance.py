from omni_core.testing import PluginConformance


class TestQwenImagePluginConformance(PluginConformance):
    plugin_name = "qwen_image"
