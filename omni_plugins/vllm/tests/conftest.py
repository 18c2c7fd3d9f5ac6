"""Shared fixtures: the tiny checkpoint written once per session, ONE vLLM engine on it for the
whole session (it takes ~20 s to start on a CPU), and plain transformers on the same checkpoint
as the reference.

The engine's tests need vLLM (``.venv-vllm``: ``scripts/bootstrap-vllm.sh``); the probe's and
the conformance tests run anywhere omni-plugin-vllm is installed, vLLM or not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]

#: what the session's engine is built with: float32 (the checkpoint's own dtype, so greedy
#: tokens equal transformers' exactly) and a short context
ENGINE_OPTIONS = {"dtype": "float32", "max_model_len": 512, "seed": 0}


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen2ForCausalLM with a ChatML tokenizer (omni-plugin-llm's)."""
    from omni_plugin_llm.model import CausalLM

    return CausalLM.make_tiny(tmp_path_factory.mktemp("vllm") / "tiny-llm", seed=0)


def resolved_stage(name: str = "generate", options: dict[str, Any] | None = None) -> Any:
    """A stage as a stage process gets it, run on the vLLM engine."""
    from omni_core.pipeline.placement import ResolvedStage

    return ResolvedStage(
        name=name,
        kind="ar",
        engine="omni_plugin_vllm.engine:VllmStageEngine",
        engine_name="vllm",
        architecture="Qwen2ForCausalLM",
        emits="tokens",
        final="text",
        inputs=(),
        placement="process",
        devices="0",
        startup_timeout=600.0,
        request_timeout=120.0,
        max_restarts=0,
        shutdown_timeout=30.0,
        engine_options=dict(options or {}),
    )


@pytest.fixture(scope="session")
def vllm_engine(tiny_llm: Path) -> Iterator[Any]:
    """The vLLM stage engine on the tiny checkpoint, as a stage process builds it: vLLM's engine
    core in this process, as in omni's (daemonic) stage processes, and starting in seconds.
    test_noise runs it the other way (vLLM's processes of its own)."""
    pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/bootstrap-vllm.sh makes .venv-vllm)")
    from omni_plugin_vllm.engine import VllmStageEngine

    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = VllmStageEngine(tiny_llm, resolved_stage(options=ENGINE_OPTIONS), dict(ENGINE_OPTIONS))
    assert engine.in_process
    yield engine
    engine.close()
    if saved is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


@pytest.fixture(scope="session")
def reference(tiny_llm: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` loaded by plain transformers: what vLLM is checked against."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_llm).eval(), AutoTokenizer.from_pretrained(tiny_llm)


@pytest.fixture(scope="session")
def greedy(reference: tuple[Any, Any]) -> Any:
    """``greedy(ids, n)``: the ``n`` new token ids of transformers' ``generate(do_sample=False)``
    (the end of sequence ignored, as ``ignore_eos`` does in vLLM)."""
    import torch

    model, _ = reference

    def run(ids: list[int], n: int) -> list[int]:
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=model.config.pad_token_id,
            )
        return [int(t) for t in out[0, len(ids) :]]

    return run
