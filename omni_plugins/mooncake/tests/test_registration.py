"""The plugin as the runtime sees it: installed, discovered, loaded through the registry."""

from __future__ import annotations

from typing import Any

import pytest
from mooncake_testkit import engine_skip_reason

from omni_core.pipeline.connector import Connector, ConnectorContext
from omni_core.testing import PluginConformance


class TestMooncakePluginConformance(PluginConformance):
    plugin_name = "mooncake"

    def test_declared_capabilities_hold(self, omni_isolated: object) -> None:
        # the kit moves payloads through the connector, in this process and a spawned one
        reason = engine_skip_reason()
        if reason:
            pytest.skip(reason)
        super().test_declared_capabilities_hold(omni_isolated)


def test_the_registry_loads_the_connector_named_as_declared(mooncake_plugins: Any) -> None:
    from omni_plugin_mooncake.connector import MooncakeConnector, MooncakeOptions

    cls = mooncake_plugins.connectors.load("mooncake")
    assert cls is MooncakeConnector and cls.name == "mooncake"
    assert cls.options_type is MooncakeOptions and cls.same_process_only is False
    assert issubclass(cls, Connector)
    assert [entry.name for entry in mooncake_plugins.connectors] == ["mooncake"]


def test_options_have_defaults_and_refuse_unknown_fields() -> None:
    from omni_plugin_mooncake.connector import MooncakeConnector
    from pydantic import ValidationError

    opts = MooncakeConnector.validate_options({})
    assert opts.local_hostname == "127.0.0.1" and opts.protocol == "tcp" and opts.device_name == ""
    assert opts.metadata_server == "P2PHANDSHAKE" and opts.buffer_bytes == 256 << 20
    assert opts.inline_threshold_bytes == 65536 and opts.max_payload_bytes is None
    for bad in ({"protocol": "udp"}, {"buffer_bytes": 1000}, {"local_hostname": ""}, {"no_such": 1}):
        with pytest.raises(ValidationError):
            MooncakeConnector.validate_options(bad)


def test_a_registry_built_instance_works(mooncake_plugins: Any) -> None:
    reason = engine_skip_reason()
    if reason:
        pytest.skip(reason)
    cls = mooncake_plugins.connectors.load("mooncake")
    conn = cls({}, ConnectorContext(run_id="registry-check", owner="orchestrator", is_owner=True))
    try:
        health = conn.health()
        assert health["ok"] is True and health["protocol"] == "tcp"
        assert health["session"].startswith("127.0.0.1:")
    finally:
        conn.close()


def test_without_a_working_engine_the_connector_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building it where mooncake.engine does not import is a ConnectorError naming the fix."""
    import builtins

    from omni_plugin_mooncake.connector import MooncakeConnector
    from omni_plugin_mooncake.engine import import_problem

    from omni_core.errors import ConnectorError

    real_import = builtins.__import__

    def no_engine(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "mooncake.engine" or (name == "mooncake" and "engine" in (args[2] or ())):
            raise ImportError("libibverbs.so.1: cannot open shared object file: No such file or directory")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_engine)
    with pytest.raises(ConnectorError, match=r"apt-get install libibverbs1"):
        MooncakeConnector({}, ConnectorContext(run_id="no-engine", owner="stage"))
    cuda = import_problem(ImportError("libcudart.so.12: cannot open shared object file"))
    assert "mooncake-transfer-engine-non-cuda" in cuda
    missing = ModuleNotFoundError("No module named 'mooncake'", name="mooncake")
    assert "omni-plugin-mooncake[cpu]" in import_problem(missing)


def test_the_rdma_devices_of_an_engine_topology() -> None:
    from omni_plugin_mooncake.engine import rdma_devices

    assert rdma_devices('{\n\t"cpu:0" : [[], []]\n}\n') == []  # what 0.3.13 reports without RDMA
    topology = '{"cpu:0": [["mlx5_0"], ["mlx5_1"]], "cpu:1": [["mlx5_1"], []], "cuda:0": [["mlx5_2"], []]}'
    assert rdma_devices(topology) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert rdma_devices("not json") == [] and rdma_devices("[1]") == []
