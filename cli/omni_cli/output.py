"""Small text helpers shared by commands: tables and exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import typer

#: exit codes: 0 fine, 1 problems found, 2 usage error (click's), 3 strict-mode plugin error
EXIT_PROBLEMS = 1
EXIT_STRICT = 3


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def fail(message: str, code: int = EXIT_PROBLEMS) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)
