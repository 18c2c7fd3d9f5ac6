"""A stage actor whose "stage" echoes its inbox, to check message order without a model (imported
by the actor's worker too: this directory reaches it through PYTHONPATH)."""

from __future__ import annotations

from typing import Any

from omni_plugin_ray.actor import StageActor


class _Echo:
    """A stand-in for a stage loop: every message of the inbox goes back out, in inbox order."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def serve(self) -> None:
        while True:
            try:
                message = self.channel.recv(0.5)
            except EOFError:
                return
            if message is not None:
                self.channel.send(message)


class EchoActor(StageActor):
    """A stage actor whose "stage" echoes what it is sent."""

    def make_loop(self, channel: Any, pipeline_json: str, name: str, advertise: bool) -> Any:
        return _Echo(channel)


class _Breaks:
    """A stand-in for a stage loop with a bug: it answers one message, then raises."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def serve(self) -> None:
        while True:
            message = self.channel.recv(0.5)
            if message is not None:
                self.channel.send({"ev": "seen", **message})
                raise KeyError("rid")


class BreakingActor(StageActor):
    """A stage actor whose loop raises after its first message."""

    def make_loop(self, channel: Any, pipeline_json: str, name: str, advertise: bool) -> Any:
        return _Breaks(channel)
