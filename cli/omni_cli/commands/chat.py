"""``omni chat --model DIR PROMPT``: one turn with a chat model (a plain language model, or an
omni model that answers in text and speech), offline, through the same pipeline runtime as
``Omni.run`` and ``omni serve``.

The answer's text goes to stdout as the model makes it; notes go to stderr, so
``omni chat ... > answer.txt`` keeps only the answer. ``--audio-out FILE.wav`` asks the model
for speech too and writes it (through a temporary name, then a rename).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from omni_cli.commands.explain import STAGE_HELP
from omni_cli.output import echo, fail, fail_with

if TYPE_CHECKING:
    from omni_core.pipeline.topology import PipelineTopology


def chat(
    prompt: str = typer.Argument(..., help="What to say to the model (the user's message)."),
    model: Path = typer.Option(..., "--model", help="Checkpoint directory of a chat model."),
    system: str | None = typer.Option(None, "--system", help="A system message before the prompt."),
    audio_out: Path | None = typer.Option(
        None, "--audio-out", help="Also answer in speech and write it to this WAV file (models that speak)."
    ),
    voice: str | None = typer.Option(None, "--voice", help="The voice to answer in (with --audio-out)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="The most tokens of text to answer."),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0.0, help="Sampling temperature; 0 or unset: greedy (the same answer every time)."
    ),
    top_p: float | None = typer.Option(None, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass."),
    seed: int | None = typer.Option(None, "--seed", help="Seed for sampling."),
    recipe: Path | None = typer.Option(None, "--recipe", help="Recipe YAML whose pipeline: section places the stages."),
    stage: list[str] = typer.Option([], "--stage", metavar="STAGE.FIELD=VALUE", help=STAGE_HELP),
) -> None:
    """Send PROMPT to a chat model and print its answer as it is made."""
    from omni_core.api import Omni, identify_model
    from omni_core.errors import ModelNotServedError, OmniError, OutputError
    from omni_core.fsutil import check_writable_dir
    from omni_core.pipeline.placement import parse_stage_overrides
    from omni_core.plugins import get_plugins
    from omni_core.tiny import has_random_weights

    if voice is not None and audio_out is None:  # a voice for an answer nobody will hear is a mistake
        raise fail(f"--voice {voice} picks the voice of the spoken answer: add --audio-out reply.wav", 2)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    sampling = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
    try:
        overrides = parse_stage_overrides(stage) or None
        if audio_out is not None:
            if audio_out.suffix.lower() != ".wav" or audio_out.is_dir():
                raise OutputError(f"--audio-out {audio_out}: name a .wav file, e.g. reply.wav", field="audio_out")
            check_writable_dir(audio_out.parent, audio_out)
        plugins = get_plugins()
        served = identify_model(model, plugins=plugins, recipe=recipe)
        if served.modality != "pipeline":
            how = (
                "not a chat model; speak with it: omni speak TEXT --model DIR"
                if served.modality == "speech"
                else "not a chat model; generate with it: omni generate PROMPT --model DIR"
            )
            raise ModelNotServedError(f"{model} is {served.describe()}, {how}", name=served.name)
        # planned once, here: the request is checked against the plan before any stage starts
        # (a wrong voice costs nothing), and Omni starts exactly this plan
        resolved = served.plan_pipeline(plugins=plugins, stages=overrides)
        outputs = ("text", "audio") if audio_out is not None else ("text",)
        params = _request_params(resolved.topology, model, sampling, outputs, voice)
        if has_random_weights(model):
            echo("note: a tiny checkpoint with RANDOM WEIGHTS (made by omni); its answer is noise.", err=True)
        with Omni(model, plugins=plugins, recipe=recipe, pipeline=resolved) as omni:
            _answer(omni, messages, params, outputs, audio_out)
    except (OmniError, ValueError) as exc:
        raise fail_with(exc) from None


def _request_params(
    topology: PipelineTopology, model: Path, sampling: dict[str, Any], outputs: tuple[str, ...], voice: str | None
) -> dict[str, dict[str, Any]]:
    """Each stage's parameters for the request, checked against the planned topology: the
    outputs asked for and the voice, named as the user gave them."""
    from omni_core.errors import OutputError

    makes = topology.modalities
    if "audio" in outputs and "audio" not in makes:
        only = ", ".join(sorted(makes))
        raise OutputError(
            f"{model} answers in {only} only, so there is no speech for --audio-out; drop --audio-out",
            field="audio_out",
        )
    params = {topology.entry.name: {k: v for k, v in sampling.items() if v is not None}}
    if voice is not None:
        speaker = topology.voice_stage
        if speaker is None or voice not in speaker.voices:
            raise OutputError(
                f"--voice {voice}: "
                + (f"the voices are {', '.join(speaker.voices)}" if speaker else "this model has no voices"),
                field="voice",
            )
        params.setdefault(speaker.name, {})["voice"] = voice
    return params


def _answer(
    omni: Any, messages: list[dict[str, str]], params: dict[str, Any], outputs: tuple[str, ...], audio_out: Path | None
) -> None:
    """Stream the answer: text to stdout as it arrives, audio gathered and written at the end."""
    import numpy as np

    from omni_core.errors import ModelRuntimeError
    from omni_core.fsutil import atomic_write
    from omni_core.speech.audio import Audio, encode

    start = time.perf_counter()
    first: float | None = None
    samples: list[Any] = []
    ended_with_newline = True
    stream = omni.stream(messages, params=params, outputs=outputs)
    for chunk in stream:
        if first is None:
            first = time.perf_counter() - start
        if chunk.modality == "text":
            for piece in chunk.items:
                sys.stdout.write(str(piece))
                ended_with_newline = str(piece).endswith("\n") if piece else ended_with_newline
            sys.stdout.flush()
        elif chunk.modality == "audio":
            samples.extend(np.asarray(item, dtype=np.float32).reshape(-1) for item in chunk.items)
    if not ended_with_newline:
        sys.stdout.write("\n")
    took = time.perf_counter() - start
    if audio_out is not None:
        if not samples:
            raise ModelRuntimeError(f"the model answered no speech for --audio-out {audio_out}")
        stage = omni.pipeline.resolved.topology.stage(omni.pipeline.resolved.topology.modalities["audio"])
        audio = Audio(np.clip(np.concatenate(samples), -1.0, 1.0), int(stage.sample_rate))
        atomic_write(audio_out, encode(audio, "wav"))
        echo(f"wrote {audio_out} ({audio.duration:.2f} s of speech at {audio.sample_rate} Hz)", err=True)
    # a stage that ran out of its token budget cut the answer short: say so, or it reads as whole
    cut = "; cut short at its token limit (--max-tokens)" if stream.finish_reason == "length" else ""
    echo(f"({took:.2f} s; first output after {first or 0:.2f} s{cut})", err=True)
