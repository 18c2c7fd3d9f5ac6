"""What the tests share: the edge, the run, and a connector of this process. Payloads are
``omni_core.testing.connectors``' cases, built by name on both sides of a process boundary, so
nothing but handles crosses the control pipe."""

from __future__ import annotations

from typing import Any

from omni_core.pipeline.connector import ConnectorContext, Edge

EDGE = Edge("thinker", "talker")
RUN_ID = "run-test"


def connector(extra: dict[str, Any] | None = None, owner: str = "test") -> Any:
    from omni_plugin_zmq.connector import TcpConnector

    return TcpConnector(extra or {}, ConnectorContext(run_id=RUN_ID, owner=owner))


def producer(extra: dict[str, Any]) -> Any:
    """A producer: the connector in a spawned process (a stage's), putting cases on command."""
    from omni_plugin_zmq.connector import TcpConnector

    from omni_core.testing.connectors import ConnectorProcess

    return ConnectorProcess(TcpConnector, RUN_ID, extra, owner="thinker")
