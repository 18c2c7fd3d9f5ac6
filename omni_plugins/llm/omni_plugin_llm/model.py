"""The ``causal-lm`` model family: a plain language model as a one-stage chat pipeline.

A decoder-only causal LM in the transformers layout (``config.json`` naming one of
:data:`ARCHITECTURES`, safetensors weights, a tokenizer) has one stage, ``generate``: it takes
the request (a prompt string, or chat messages) and emits token ids, final for ``text``. The
stage names its checkpoint architecture, so a registered stage engine (vLLM) may run it
instead of :class:`~omni_plugin_llm.engine.TransformersCausalLM`.

Torch-free: the engine imports torch and transformers in the stage's own process.
"""

from __future__ import annotations

import json
from pathlib import Path

from omni_core.errors import CheckpointFormatError
from omni_core.pipeline.topology import PipelineTopology, StageDef

#: the checkpoint classes this family serves (the manifest's ``architectures``)
ARCHITECTURES = (
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Gemma2ForCausalLM",
    "Phi3ForCausalLM",
)

#: ``module:Class`` of the model's own stage engine
ENGINE = "omni_plugin_llm.engine:TransformersCausalLM"


def architecture_of(model_dir: Path) -> str:
    """``architectures[0]`` of the checkpoint's ``config.json``: what a stage engine matches on."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointFormatError(f"{path}: cannot read the model's config ({exc})") from None
    archs = config.get("architectures") if isinstance(config, dict) else None
    if not archs or not isinstance(archs, list) or not isinstance(archs[0], str):
        raise CheckpointFormatError(
            f'{path} names no architectures; a causal LM\'s config.json has e.g. "architectures": ["Qwen2ForCausalLM"]'
        )
    return archs[0]


class CausalLM:
    """A plain language model: one autoregressive stage, final for text."""

    @classmethod
    def topology_for(cls, model_dir: Path) -> PipelineTopology:
        return PipelineTopology(
            name="causal-lm",
            stages=(
                StageDef(
                    name="generate",
                    kind="ar",
                    engine=ENGINE,
                    engine_name="transformers",
                    architecture=architecture_of(model_dir),
                    emits="tokens",
                    final="text",
                ),
            ),
        )

    @classmethod
    def make_tiny(cls, directory: Path, seed: int = 0) -> Path:
        """A tiny random-weight Qwen2ForCausalLM (see :mod:`omni_plugin_llm.tiny`)."""
        from omni_plugin_llm.tiny import write_tiny_checkpoint

        return write_tiny_checkpoint(directory, seed=seed)
