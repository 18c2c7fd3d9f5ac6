"""Small text helpers shared by commands: tables, exit codes, and safe echoing.

Text shown by omni often comes from plugins (names, descriptions, reasons, fix hints), so
:func:`echo`, :func:`table` and :func:`fail` escape terminal control characters
(:func:`omni_core.text.printable`): a plugin cannot recolour the terminal or fake a line.
JSON output needs nothing: ``json.dumps`` escapes control characters itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import typer

from omni_core.text import printable

#: exit codes: 0 fine, 1 problems found, 2 usage error (click's), 3 strict-mode plugin error,
#: 130 the user's own Ctrl-C. No other code ever leaves omni.
EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_STRICT = 3
EXIT_INTERRUPTED = 130
EXIT_CODES = frozenset({EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_STRICT, EXIT_INTERRUPTED})


def echo(text: object = "", err: bool = False) -> None:
    """``typer.echo`` with control characters escaped (newlines and tabs kept)."""
    typer.echo(printable(text), err=err)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[printable(c, one_line=True) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def fail(message: str, code: int = EXIT_PROBLEMS) -> typer.Exit:
    echo(f"error: {message}", err=True)
    return typer.Exit(code)


def exit_code_for(exc: BaseException) -> int:
    """The exit code an error ends a command with: the one its class declares
    (:attr:`omni_core.errors.OmniError.exit_code`), 1 for anything else. Only 1 and 3 are
    error codes; a class (a plugin's subclass, say) declaring any other is reported as 1."""
    from omni_core.errors import OmniError

    code = exc.exit_code if isinstance(exc, OmniError) else EXIT_PROBLEMS
    return code if code in (EXIT_PROBLEMS, EXIT_STRICT) else EXIT_PROBLEMS


def fail_with(exc: BaseException) -> typer.Exit:
    """:func:`fail` for a caught error: its message, and the exit code its class declares."""
    return fail(str(exc), exit_code_for(exc))
