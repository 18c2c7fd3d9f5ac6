"""What the tests share: the edges, connectors of this process and of a stage process, and the
skip reason. Payloads are ``omni_core.testing.connectors``' cases, built by name on both sides
of a process boundary."""

from __future__ import annotations

import os
from typing import Any

from omni_core.pipeline.connector import ConnectorContext, Edge

EDGE = Edge("thinker", "talker")
OTHER_EDGE = Edge("talker", "code2wav")
#: the large payload of the tests: a 64 MiB tensor
BIG = "big_64"


def mooncake(run_id: str, *, who: str = "stage", owner: bool = False, **extra: Any) -> Any:
    from omni_plugin_mooncake.connector import MooncakeConnector

    return MooncakeConnector(extra, ConnectorContext(run_id=run_id, owner=who, is_owner=owner))


def engine_skip_reason() -> str | None:
    from omni_plugin_mooncake.engine import engine_problem

    problem = engine_problem()
    if problem is not None and os.environ.get("CI"):
        # CI installs everything the transport needs (scripts/bootstrap.sh): a skip there would hide a break
        import pytest

        pytest.fail(f"CI must run the Mooncake transport tests, and the engine is not usable: {problem}")
    return None if problem is None else f"Mooncake's transfer engine is not usable here: {problem}"


def stage(run_id: str, extra: dict[str, Any] | None = None) -> Any:
    """A stage process: the connector in a spawned process (a fresh interpreter, as the runtime
    starts one), putting and getting cases on command."""
    from omni_plugin_mooncake.connector import MooncakeConnector

    from omni_core.testing.connectors import ConnectorProcess

    return ConnectorProcess(MooncakeConnector, run_id, extra, owner="child", answer_timeout=180)
