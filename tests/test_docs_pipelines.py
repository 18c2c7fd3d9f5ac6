"""docs/pipelines.md's recipe reference names every placement field with its built-in default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omni_core.pipeline.placement import BUILTIN_EDGE, BUILTIN_STAGE, EdgeSettings, PipelinePlacement, StagePlacement

PAGE = Path(__file__).resolve().parents[1] / "docs" / "pipelines.md"


def rows() -> dict[str, str]:
    """Field -> its Built-in cell, from every reference table on the page."""
    found: dict[str, str] = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\| `(\w+)` \| (.*?) \|", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


@pytest.mark.parametrize("field", sorted(StagePlacement.model_fields))
def test_every_stage_field_with_its_builtin_default(field: str) -> None:
    cell = rows().get(field)
    assert cell is not None, f"docs/pipelines.md has no row for stage field {field!r}"
    default = getattr(BUILTIN_STAGE, field)
    want = (
        "{}"
        if field in ("engine_options", "executor_options")
        else "chosen"
        if field == "engine"
        else (f'"{default}"' if isinstance(default, str) and field == "devices" else None)
    )
    if want is None:
        want = str(default if not isinstance(default, float) else f"{default:g}")
    assert want in cell.strip("`"), f"{field}: the page says {cell!r}, the built-in is {want!r}"


@pytest.mark.parametrize("field", sorted(set(EdgeSettings.model_fields)))
def test_every_edge_field_with_its_builtin_default(field: str) -> None:
    cell = rows().get(field)
    assert cell is not None, f"docs/pipelines.md has no row for edge field {field!r}"
    if field in BUILTIN_EDGE:
        value = BUILTIN_EDGE[field]
        assert f"{value:g}" in cell, f"{field}: the page says {cell!r}, the built-in is {value!r}"
    else:  # the connector: chosen by where the ends run
        assert "inprocess" in cell and "shm" in cell


@pytest.mark.parametrize(
    "field", sorted(set(PipelinePlacement.model_fields) - {"defaults", "stages", "edges", "edge_defaults"})
)
def test_every_pipeline_field(field: str) -> None:
    cell = rows().get(field)
    assert cell is not None, f"docs/pipelines.md has no row for pipeline field {field!r}"
    default = PipelinePlacement.model_fields[field].get_default(call_default_factory=True)
    assert str(default) in cell
