"""The tiny checkpoint, the topology and the plugin's registration."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

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


class _Call:
    """Pickles as a call of ``function(*args)``: what a hostile pickle would run."""

    def __init__(self, function: Any, args: tuple[Any, ...]) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.function, self.args


def test_the_voices_are_read_without_torch_in_the_files_order(tiny_omni: Path, tmp_path: Path) -> None:
    import torch
    from omni_plugin_qwen_omni.model import speaker_names, voices_of

    from omni_core.errors import ModelLoadError

    path = tiny_omni / "spk_dict.pt"
    assert speaker_names(path) == list(torch.load(path, weights_only=True)) == ["Chelsie", "Ethan"]
    assert voices_of(tiny_omni) == ("Chelsie", "Ethan")
    # the legacy (non-zip) format of torch.save, the Ethan-first order kept, the default still first
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    speakers = {"Ethan": {"bos_token": 1, "cond": torch.zeros(2)}, "Chelsie": {"bos_token": 2, "cond": torch.ones(2)}}
    torch.save(speakers, legacy / "spk_dict.pt", _use_new_zipfile_serialization=False)
    assert speaker_names(legacy / "spk_dict.pt") == ["Ethan", "Chelsie"]
    assert voices_of(legacy) == ("Chelsie", "Ethan")
    # what a pickle names is never called: this one would create a file (open(path, "w"))
    planted = tmp_path / "planted"
    payload = pickle.dumps(_Call(open, (str(planted), "w")), protocol=2)
    with zipfile.ZipFile(legacy / "spk_dict.pt", "w") as archive:
        archive.writestr("spk_dict/data.pkl", payload)
    with pytest.raises(ModelLoadError, match="holds no voices"):
        speaker_names(legacy / "spk_dict.pt")
    assert not planted.exists()
    (legacy / "spk_dict.pt").write_bytes(b"not a pickle")
    with pytest.raises(ModelLoadError, match=r"is not a speaker file torch\.save wrote"):
        speaker_names(legacy / "spk_dict.pt")


def test_planning_the_pipeline_does_not_import_torch(tiny_omni: Path) -> None:
    """``omni explain pipeline`` (every plan: ``omni chat``, ``omni serve``) lists the voices in
    the orchestrator's process, which must not need torch: checked in a fresh interpreter."""
    import subprocess
    import sys

    code = f"""
import sys
from omni_cli.main import main
sys.argv = ["omni", "explain", "pipeline", "--model", {str(tiny_omni)!r}]
try:
    main()
except SystemExit as exit:
    print("exit", exit.code)
print("imported:", [m for m in ("torch", "transformers") if m in sys.modules])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert "pipeline qwen2.5-omni" in done.stdout and "talker" in done.stdout, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "imported: []", done.stdout + done.stderr
