from omni_core.testing import PluginConformance


class TestFluxPluginConformance(PluginConformance):
    plugin_name = "flux"
