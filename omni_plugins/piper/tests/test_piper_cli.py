"""The real omni, in this venv, with the voice package installed: `omni speak` and `omni explain
tts` with a Piper voice named by its short name, its file, or its directory."""

from __future__ import annotations

import os
import subprocess
import sys
import wave
from pathlib import Path

OMNI = Path(sys.executable).parent / "omni"


def omni(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    environ.update(OMNI_CONFIG_DIR=str(home / "config"), OMNI_CACHE_DIR=str(home / "cache"), **(env or {}))
    return subprocess.run([str(OMNI), *args], capture_output=True, text=True, env=environ, cwd=home, timeout=300)


def test_speak_with_the_voice_by_short_name(tmp_path: Path) -> None:
    result = omni(tmp_path, "speak", "Hello.", "--model", "joe", "--out", "hello.wav")
    assert result.returncode == 0, result.stderr
    assert "adapter      piper" in result.stdout and "RANDOM" not in result.stdout
    with wave.open(str(tmp_path / "hello.wav")) as wav:
        assert wav.getframerate() == 22050
        assert 0.3 < wav.getnframes() / 22050 < 2.0
    assert not (tmp_path / "cache" / "tiny").exists()  # no random checkpoint was made


def test_explain_and_speak_by_short_name(tmp_path: Path) -> None:
    result = omni(tmp_path, "explain", "tts", "--model", "joe")
    assert result.returncode == 0, result.stderr
    assert "identified by piper: Piper voice en_US-joe-medium.onnx" in result.stdout
    assert "=> piper" in result.stdout
    missing = omni(tmp_path, "explain", "tts", "--model", "nobody")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "joe (piper)" in missing.stderr


def test_a_streamed_file_by_short_name(tmp_path: Path) -> None:
    result = omni(tmp_path, "speak", "One. Two.", "--model", "en_US-joe-medium", "--stream", "--out", "x.flac")
    assert result.returncode == 0, result.stderr
    assert "chunks       2" in result.stdout


def test_speaking_with_a_voice_never_imports_torch(tmp_path: Path) -> None:
    """Piper runs on onnxruntime: the speech runtime around it (seeding, keeping libraries
    quiet) must not import torch, diffusers or transformers, which would cost seconds."""
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('IMPORTED', sorted(m for m in ('torch', 'diffusers', 'transformers') "
        "if m in sys.modules), file=sys.stderr))\n"
        "from omni_cli.main import main\n"
        "sys.argv = ['omni', 'speak', 'Hello there.', '--model', 'joe', '--out', 'hello.wav']\n"
        "main()\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    environ.update(OMNI_CONFIG_DIR=str(tmp_path / "config"), OMNI_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hello.wav").is_file()
    assert "IMPORTED []" in result.stderr, result.stderr
