"""The plugin as the runtime sees it: installed, discovered, loaded through the registry."""

from __future__ import annotations

from typing import Any

from omni_core.pipeline.connector import Connector, ConnectorContext
from omni_core.testing import PluginConformance


class TestConnectorsPluginConformance(PluginConformance):
    plugin_name = "connectors"


def test_the_registry_loads_both_connectors_named_as_declared(connector_plugins: Any) -> None:
    from omni_plugin_connectors.inprocess import InProcessConnector
    from omni_plugin_connectors.shm import ShmConnector, ShmOptions

    shm = connector_plugins.connectors.load("shm")
    assert shm is ShmConnector and shm.name == "shm"
    assert shm.options_type is ShmOptions and shm.same_process_only is False
    inprocess = connector_plugins.connectors.load("inprocess")
    assert inprocess is InProcessConnector and inprocess.name == "inprocess"
    assert inprocess.same_process_only is True
    assert sorted(entry.name for entry in connector_plugins.connectors) == ["inprocess", "shm"]
    for cls in (shm, inprocess):
        assert issubclass(cls, Connector)
        conn = cls({}, ConnectorContext(run_id="registry-check", owner="orchestrator", is_owner=True))
        assert conn.health()["ok"] is True
        conn.close()
