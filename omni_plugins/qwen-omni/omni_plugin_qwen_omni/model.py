"""The Qwen2.5-Omni model family: its three-stage topology, and a tiny checkpoint for tests."""

from __future__ import annotations

from pathlib import Path

from omni_core.pipeline.topology import PipelineTopology, StageDef

_STAGES = "omni_plugin_qwen_omni.stages"
#: what Qwen2.5-Omni's BigVGAN writes; no field of the checkpoint's config names it
SAMPLE_RATE = 24000


def voices_of(model_dir: Path) -> tuple[str, ...]:
    """The checkpoint's voices (the speakers of ``spk_dict.pt``), its default first: what the
    talker takes as ``voice`` and the server lists and accepts as ``audio.voice``."""
    from omni_plugin_qwen_omni.stages import DEFAULT_VOICE, _load_speakers

    names = [str(name) for name in _load_speakers(Path(model_dir))]
    default = DEFAULT_VOICE if DEFAULT_VOICE in names else names[0]
    return (default, *(n for n in names if n != default))


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
