from omni_core.testing import PluginConformance


class TestLtxVideoPluginConformance(PluginConformance):
    plugin_name = "ltx_video"
