from omni_core.testing import PluginConformance


class TestCacheDitConformance(PluginConformance):
    plugin_name = "cache_dit"
