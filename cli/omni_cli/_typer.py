"""Typer apps that start fast.

Recent Typer releases coerce every parameter value through a pydantic ``TypeAdapter``, built
the first time the parameter is processed, and skip that only for bool flags whose value is
already a bool. Typer's own ``--help`` option has no default (its value is ``None`` unless
given), so *every* command invocation builds one adapter and imports pydantic for it: about
40-70 ms, more than all of ``omni plugins list``'s own work. Giving the help option the default
it means (``False``) takes that fast path; help output and behaviour are unchanged.

Every app and command of the CLI is built with :class:`OmniTyper` so this holds everywhere.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


def _cheap_help_option(option: Any) -> Any:
    if option is not None and getattr(option, "default", False) is None:
        option.default = False
    return option


class OmniGroup(TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:
        return _cheap_help_option(super().get_help_option(ctx))


class OmniCommand(TyperCommand):
    def get_help_option(self, ctx: Any) -> Any:
        return _cheap_help_option(super().get_help_option(ctx))


class OmniTyper(typer.Typer):
    """A :class:`typer.Typer` whose groups and commands default to the classes above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("cls", OmniGroup)
        super().__init__(*args, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("cls") is None:
            kwargs["cls"] = OmniCommand
        return super().command(*args, **kwargs)
