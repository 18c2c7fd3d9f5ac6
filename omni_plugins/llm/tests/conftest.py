"""Shared fixtures: the tiny checkpoint written once per session, the engine and a plain
transformers reference loaded on it once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen2ForCausalLM (seed 0)."""
    from omni_plugin_llm.model import CausalLM

    return CausalLM.make_tiny(tmp_path_factory.mktemp("llm") / "tiny-llm", seed=0)


@pytest.fixture(scope="session")
def llm_engine(tiny_llm: Path) -> Any:
    """The transformers stage engine on the tiny checkpoint, built as a stage process builds it."""
    from omni_plugin_llm.engine import TransformersCausalLM
    from omni_plugin_llm.model import CausalLM

    stage = CausalLM.topology_for(tiny_llm).stage("generate")
    engine = TransformersCausalLM(tiny_llm, stage, {})
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def reference(tiny_llm: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` loaded by plain transformers: what the engine is checked against."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_llm).eval(), AutoTokenizer.from_pretrained(tiny_llm)


@pytest.fixture(scope="session")
def llm_plugins() -> Any:
    """The installed plugins (the pipeline runtime needs the connectors plugin beside this one)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings())


@pytest.fixture(scope="session")
def greedy(reference: tuple[Any, Any]) -> Any:
    """``greedy(ids, max_new_tokens)``: the new token ids of ``model.generate(do_sample=False)``."""
    import torch

    model, _ = reference

    def run(ids: list[int], max_new_tokens: int) -> list[int]:
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens)
        return [int(t) for t in out[0, len(ids) :]]

    return run
