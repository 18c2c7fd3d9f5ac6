"""The repository's Qwen2.5-Omni recipes resolve against the family's tiny checkpoint, and place
the stages as they say (nothing is loaded: what ``omni explain pipeline`` prints)."""

from __future__ import annotations

from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


@pytest.mark.parametrize(
    ("recipe", "placements"),
    [
        ("qwen2.5-omni.yaml", {"thinker": "process", "talker": "process", "token2wav": "process"}),
        ("qwen2.5-omni-single-process.yaml", {"thinker": "inprocess", "talker": "inprocess", "token2wav": "inprocess"}),
    ],
)
def test_the_recipes_place_the_three_stages(tiny_omni: Path, recipe: str, placements: dict[str, str]) -> None:
    from omni_core.generation.recipe import load_recipe
    from omni_core.pipeline.placement import plan_pipeline

    loaded = load_recipe(RECIPES / recipe)
    assert loaded.model_class_name == "qwen2.5-omni"
    resolved = plan_pipeline(tiny_omni, recipe=loaded.pipeline)
    assert {s.name: s.placement for s in resolved.stages} == placements
    assert resolved.edge("thinker", "talker").window == 1  # the talker starts on the first tokens
    assert resolved.stage("thinker").engine_options == {"dtype": "bfloat16"}
    assert resolved.stage("token2wav").engine_options == {}


def test_the_single_process_recipe_answers(tiny_omni: Path) -> None:
    """Every stage a thread of this process, loading at the same time (in bfloat16, as the
    recipe says): each loads alone, so none sees another's half-set transformers state."""
    from omni_core.api import Omni

    with Omni(tiny_omni, recipe=RECIPES / "qwen2.5-omni-single-process.yaml") as omni:
        result = omni.run([{"role": "user", "content": "hi"}], params={"thinker": {"max_tokens": 4}})
    assert result.outputs["text"] and result.outputs["audio"]
    assert all(sample.ndim == 1 and sample.numel() > 0 for sample in result.outputs["audio"])
