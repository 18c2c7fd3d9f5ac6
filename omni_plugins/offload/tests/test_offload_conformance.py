from omni_core.offload import Offloader, offloader_contract_problems
from omni_core.testing import PluginConformance


class TestOffloadPluginConformance(PluginConformance):
    plugin_name = "offload"

    def test_strategies_keep_the_offloader_contract(self, offload_plugins) -> None:  # type: ignore[no-untyped-def]
        """The kit checks the Offloader contract; this also checks each is an Offloader subclass
        with every method implemented, named as registered."""
        for entry in offload_plugins.offloaders:
            cls = entry.load()
            assert offloader_contract_problems(cls) == []
            assert issubclass(cls, Offloader) and cls.name == entry.name
