from __future__ import annotations

import pytest
from pydantic import ValidationError

from omni_core.pipeline.connector import Connector
from omni_core.testing import PluginConformance


class TestTcpPluginConformance(PluginConformance):
    plugin_name = "zmq"


def test_loads_through_the_registry_as_tcp(tcp_plugins) -> None:  # type: ignore[no-untyped-def]
    cls = tcp_plugins.connectors.load("tcp")
    assert issubclass(cls, Connector) and cls.name == "tcp"
    assert cls.same_process_only is False
    opts = cls.validate_options({"port": 0, "max_payload_bytes": 10})
    assert opts.host == "127.0.0.1" and opts.inline_threshold_bytes == 65536
    assert opts.max_buffered_bytes == 1 << 30 and opts.advertise_host is None


@pytest.mark.parametrize(
    "extra",
    [
        {"prot": 1},
        {"host": ""},
        {"port": 70000},
        {"port": -1},
        {"max_buffered_bytes": 0},
        {"per_owner": {"a": {"pot": 1}}},
    ],
)
def test_bad_options_are_refused_by_name(tcp_plugins, extra) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError):
        tcp_plugins.connectors.load("tcp").validate_options(extra)
