"""The tiny checkpoint, the topology and the plugin's registration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_core.testing import PluginConformance


class TestQwenOmniPluginConformance(PluginConformance):
    plugin_name = "qwen-omni"


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_make_tiny_writes_the_real_layout_the_same_way_for_a_seed(tiny_omni: Path, tmp_path: Path) -> None:
    from omni_plugin_qwen_omni.model import QwenOmni

    assert set(_files(tiny_omni)) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "spk_dict.pt",
        "tokenizer.json",
        "tokenizer_config.json",
        "omni-tiny.json",
    }
    config = json.loads((tiny_omni / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5OmniForConditionalGeneration"]
    assert config["model_type"] == "qwen2_5_omni"
    marker = json.loads((tiny_omni / "omni-tiny.json").read_text())
    assert marker["family"] == "qwen2.5-omni" and marker["seed"] == 0 and marker["random_weights"] is True

    QwenOmni.make_tiny(tmp_path / "again", seed=0)
    assert _files(tmp_path / "again") == _files(tiny_omni)
    QwenOmni.make_tiny(tmp_path / "other", seed=1)
    other = _files(tmp_path / "other")
    assert other["model.safetensors"] != _files(tiny_omni)["model.safetensors"]
    assert other["spk_dict.pt"] != _files(tiny_omni)["spk_dict.pt"]
    assert other["tokenizer.json"] == _files(tiny_omni)["tokenizer.json"]  # the tokenizer has no seed


def test_the_tiny_checkpoint_loads_through_transformers(tiny_omni: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_omni)
    assert sorted(model.speaker_map) == ["Chelsie", "Ethan"]
    text = model.thinker.config.text_config
    assert text.hidden_size // text.num_attention_heads == 64  # one head of 64: the narrowest vLLM runs on a CPU
    assert model.token2wav.dtype == torch.float32
    tokenizer = AutoTokenizer.from_pretrained(tiny_omni)
    assert tokenizer.audio_token == "<|AUDIO|>"
    assert tokenizer.convert_tokens_to_ids("<|AUDIO|>") == model.config.thinker_config.audio_token_index


def test_the_topology_is_thinker_talker_token2wav(tiny_omni: Path) -> None:
    from omni_plugin_qwen_omni.model import QwenOmni

    topology = QwenOmni.topology_for(tiny_omni)
    assert topology.names == ["thinker", "talker", "token2wav"]
    thinker, talker, token2wav = topology.stages
    assert (thinker.kind, thinker.final, thinker.inputs, thinker.engine_name) == ("ar", "text", (), "transformers")
    assert thinker.architecture == "Qwen2_5OmniThinkerForConditionalGeneration"
    assert (talker.kind, talker.final, talker.inputs) == ("ar", None, ("thinker",))
    assert talker.architecture == "Qwen2_5OmniTalkerForConditionalGeneration"
    assert (token2wav.kind, token2wav.final, token2wav.inputs) == ("generation", "audio", ("talker",))
    assert token2wav.sample_rate == 24000
    assert topology.plan(("text",)) == {"thinker": ("output",)}  # a text-only request stops at the thinker
    assert topology.plan(("text", "audio")) == {
        "thinker": ("talker", "output"),
        "talker": ("token2wav",),
        "token2wav": ("output",),
    }


def test_omni_identifies_the_checkpoint_as_this_family(tiny_omni: Path) -> None:
    from omni_core.api import identify_model

    identity = identify_model(tiny_omni)
    assert identity.modality == "pipeline" and identity.name == "qwen2.5-omni" and identity.task == "chat"
