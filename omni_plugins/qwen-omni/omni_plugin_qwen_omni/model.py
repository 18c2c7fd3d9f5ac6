"""The Qwen2.5-Omni model family: its three-stage topology, and a tiny checkpoint for tests."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import IO, Any

from omni_core.errors import ModelLoadError
from omni_core.pipeline.topology import PipelineTopology, StageDef

_STAGES = "omni_plugin_qwen_omni.stages"
#: what Qwen2.5-Omni's BigVGAN writes; no field of the checkpoint's config names it
SAMPLE_RATE = 24000
#: the voice ``generate`` speaks with unless told otherwise
DEFAULT_VOICE = "Chelsie"
#: what ``torch.save``'s legacy (non-zip) format writes first
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def voices_of(model_dir: Path) -> tuple[str, ...]:
    """The checkpoint's voices (the speakers of ``spk_dict.pt``), its default first: what the
    talker takes as ``voice`` and the server lists and accepts as ``audio.voice``. Read without
    torch (every plan of the pipeline asks, in the orchestrator's process)."""
    names = speaker_names(Path(model_dir) / "spk_dict.pt")
    default = DEFAULT_VOICE if DEFAULT_VOICE in names else names[0]
    return (default, *(n for n in names if n != default))


class _Opaque:
    """Whatever the pickle builds besides dicts (tensors, their storages): nothing. The class
    named in the pickle is never imported, so reading the names runs none of its code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _NamesOnly(pickle.Unpickler):
    """Unpickles ``torch.save``'s object graph with every class but the dict kinds replaced by
    :class:`_Opaque` and every tensor storage by None: the dict's keys survive, nothing runs."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in (("collections", "OrderedDict"), ("builtins", "dict")):
            return dict
        return _Opaque

    def persistent_load(self, pid: Any) -> None:
        return None


def speaker_names(path: Path) -> list[str]:
    """The voice names of a ``spk_dict.pt`` (``{name: {"bos_token", "cond", "ref_mel"}}``, as
    ``torch.save`` writes it), in the file's order, without torch: its pickle is read with every
    class and tensor stubbed out (:class:`_NamesOnly`), so only the dict's keys are built."""
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: a Qwen2.5-Omni checkpoint holds its voices in spk_dict.pt")
    try:
        speakers = _unpickle_torch_save(path)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError, KeyError) as exc:
        raise ModelLoadError(f"{path} is not a speaker file torch.save wrote: {type(exc).__name__}: {exc}") from None
    if not isinstance(speakers, dict) or not speakers or not all(isinstance(k, str) for k in speakers):
        raise ModelLoadError(f"{path} holds no voices: it should map each voice's name to its tensors")
    return list(speakers)


def _unpickle_torch_save(path: Path) -> Any:
    """The object ``torch.save`` wrote to ``path``, with its tensors as None."""
    if zipfile.is_zipfile(path):  # the format since torch 1.6: <archive>/data.pkl beside the storages
        with zipfile.ZipFile(path) as archive:
            member = next(n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl"))
            with archive.open(member) as data:
                return _NamesOnly(data).load()
    with path.open("rb") as data:  # the legacy format: magic, protocol, system info, then the object
        if _load(data) != _LEGACY_MAGIC:
            raise ValueError("neither a zip archive nor torch's legacy format")
        _load(data)
        _load(data)
        return _load(data)


def _load(data: IO[bytes]) -> Any:
    return _NamesOnly(data).load()


class QwenOmni:
    """Qwen2.5-Omni: ``thinker`` (text, final for text) -> ``talker`` (codec codes) ->
    ``token2wav`` (waveform, final for audio). A text-only request stops after the thinker."""

    @classmethod
    def topology_for(cls, model_dir: Path) -> PipelineTopology:
        return PipelineTopology(
            name="qwen2.5-omni",
            stages=(
                StageDef(
                    name="thinker",
                    kind="ar",
                    engine=f"{_STAGES}:ThinkerStage",
                    engine_name="transformers",
                    architecture="Qwen2_5OmniThinkerForConditionalGeneration",
                    reads=("text", "input_audio"),
                    emits="tokens",
                    final="text",
                ),
                StageDef(
                    name="talker",
                    kind="ar",
                    engine=f"{_STAGES}:TalkerStage",
                    engine_name="transformers",
                    architecture="Qwen2_5OmniTalkerForConditionalGeneration",
                    inputs=("thinker",),
                    emits="codes",
                    voices=voices_of(Path(model_dir)),
                ),
                StageDef(
                    name="token2wav",
                    kind="generation",
                    engine=f"{_STAGES}:Token2WavStage",
                    engine_name="transformers",
                    architecture="Qwen2_5OmniToken2WavModel",
                    inputs=("talker",),
                    emits="audio",
                    final="audio",
                    sample_rate=SAMPLE_RATE,
                ),
            ),
        )

    @classmethod
    def make_tiny(cls, directory: Path, seed: int = 0) -> None:
        """A random-weight checkpoint in the real layout (:mod:`omni_plugin_qwen_omni.tiny`), with
        the tiny-checkpoint marker (``omni models make-tiny`` rewrites it naming the plugin)."""
        from omni_core.tiny import write_marker
        from omni_plugin_qwen_omni import __version__
        from omni_plugin_qwen_omni.tiny import write_tiny_checkpoint

        write_tiny_checkpoint(directory, seed=seed)
        write_marker(directory, family="qwen2.5-omni", seed=seed, provider=f"omni-plugin-qwen-omni {__version__}")
