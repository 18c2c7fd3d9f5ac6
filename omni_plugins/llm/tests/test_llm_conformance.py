from omni_core.testing import PluginConformance


class TestLlmPluginConformance(PluginConformance):
    plugin_name = "llm"
