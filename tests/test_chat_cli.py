"""``omni chat``: one turn with a chat model, offline, through the pipeline runtime. The model is
the three-stage test pipeline (tests/fixtures/plugins/omni-fixture-pipeline), pip-installed into
a private site; every answer is checked against the same stage classes called in this process.
What a user gets when they get something wrong is part of the fault battery
(tests/test_faults_chat.py)."""

from __future__ import annotations

import subprocess
import wave
from pathlib import Path

from serving import OMNI, chat_marks, server_env

pytestmark = chat_marks()


def chat(tmp_path: Path, site: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OMNI, "chat", *map(str, args)],
        env=server_env(tmp_path, sites=(site,)),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )


def expected(model: Path, max_tokens: int, voice: str | None = None) -> dict[str, object]:
    import numpy as np
    from omni_fixture_pipeline.stages import reference

    messages = [{"role": "user", "content": "hi"}]
    want = reference(model, messages, {"tokens": {"max_tokens": max_tokens}, "wave": {"voice": voice}})
    samples = np.clip(np.concatenate([np.asarray(a, dtype=np.float32) for a in want["audio"]]), -1, 1)
    return {"text": "".join(want["text"]), "pcm": (np.round(samples * 32767)).astype("<i2").tobytes()}


def test_the_answer_is_printed_and_the_notes_go_to_stderr(chat_site: Path, chat_model: Path, tmp_path: Path) -> None:
    result = chat(tmp_path, chat_site, "--model", chat_model, "hi", "--max-tokens", "5")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected(chat_model, 5)["text"] + "\n"  # stdout is the answer alone
    assert "RANDOM WEIGHTS" in result.stderr and "Traceback" not in result.stderr


def test_audio_out_writes_the_speech_in_the_voice_asked(chat_site: Path, chat_model: Path, tmp_path: Path) -> None:
    for voice in ("high", "low"):
        out = tmp_path / f"{voice}.wav"
        result = chat(
            tmp_path, chat_site, "--model", chat_model, "hi", "--max-tokens", "4", "--audio-out", out, "--voice", voice
        )
        assert result.returncode == 0, result.stderr
        assert f"wrote {out}" in result.stderr
        with wave.open(str(out)) as wav:
            assert (wav.getframerate(), wav.getnchannels()) == (16000, 1)
            frames = wav.readframes(wav.getnframes())
        want = expected(chat_model, 4, voice)["pcm"]
        assert len(frames) == len(want)
        # the WAV holds the stages' samples as 16-bit PCM (rounding may differ by one step)
        import numpy as np

        assert np.abs(np.frombuffer(frames, "<i2").astype(int) - np.frombuffer(want, "<i2").astype(int)).max() <= 1
    assert not list(tmp_path.glob("*.tmp*")) and not list(tmp_path.glob(".*wav*"))
