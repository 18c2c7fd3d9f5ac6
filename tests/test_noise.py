"""The model libraries' own output stays off an omni user's terminal, and ``--verbose`` lets it
through: the real ``omni`` on real tiny checkpoints of real installed families, each in a
fresh, empty home and cache (as on a first run).

What omni itself prints on stderr: ``note:``/``warning:`` lines, the embedded default being
made, chat's timing line, and its progress bars (a diffusion model's load and denoising steps). Everything else on
stderr is a library's: transformers' "Loading weights" and "Writing model shards" bars, its
logged advisories (``[transformers] ...``), Python warnings."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

OMNI = Path(sys.executable).parent / "omni"
#: omni's own stderr lines: its notes and warnings, the embedded default being made, chat's
#: closing timing line, its bars
OMNI_LINE = re.compile(
    r"^(note: |warning: |making the embedded default: |\(\d+\.\d+ s; first output after "
    r"|Loading pipeline components\.\.\.: |[\w.-]+ denoising: )"
)


def needs(plugin: str) -> pytest.MarkDecorator:
    found = importlib.util.find_spec(f"omni_plugin_{plugin}") is not None
    return pytest.mark.skipif(not found, reason=f"the {plugin} plugin is not installed here")


def omni(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMNI_", "PYTHONWARNINGS", "HF_"))}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), OMNI_CONFIG_DIR=str(tmp_path / "config"), OMNI_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [str(OMNI), *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def foreign(stderr: str) -> list[str]:
    """The stderr lines that are not omni's (a bar redraws with carriage returns: each is a line)."""
    lines = [line.strip() for line in re.split(r"[\r\n]+", stderr)]
    return [line for line in lines if line and not OMNI_LINE.match(line)]


@pytest.mark.parametrize(
    "family", [pytest.param("vits", marks=needs("vits")), pytest.param("bark", marks=needs("bark"))]
)
def test_making_and_speaking_with_a_tiny_voice_prints_only_omni(tmp_path: Path, family: str) -> None:
    made = omni(tmp_path, "models", "make-tiny", family, "ck")
    assert foreign(made.stderr) == []
    assert made.stdout.startswith(f"wrote a tiny {family} checkpoint")
    spoken = omni(tmp_path, "speak", "--model", "ck", "Hello there.", "-o", "x.wav")
    assert foreign(spoken.stderr) == []
    assert (tmp_path / "x.wav").stat().st_size > 44


@needs("llm")
def test_chatting_with_a_tiny_language_model_prints_only_omni(tmp_path: Path) -> None:
    omni(tmp_path, "models", "make-tiny", "causal-lm", "ck")
    chat = omni(tmp_path, "chat", "--model", "ck", "Hello", "--max-tokens", "3")
    assert foreign(chat.stderr) == []
    assert chat.stderr.startswith("note: a tiny checkpoint with RANDOM WEIGHTS")


@needs("flux")
def test_the_embedded_image_default_keeps_omnis_bars_and_nothing_else(tmp_path: Path) -> None:
    made = omni(tmp_path, "generate", "a red fox", "-o", "fox.png", "--steps", "1")
    assert foreign(made.stderr) == []
    # the load bar and the denoising bar are omni's: they stay
    assert "Loading pipeline components...: 100%" in made.stderr
    assert "flux1-schnell denoising: 100%" in made.stderr


@needs("bark")
def test_verbose_lets_the_libraries_speak(tmp_path: Path) -> None:
    made = omni(tmp_path, "--verbose", "models", "make-tiny", "bark", "ck")
    assert "Writing model shards" in made.stderr  # transformers' save bar
    spoken = omni(tmp_path, "--verbose", "speak", "--model", "ck", "Hello there.", "-o", "x.wav")
    assert "Loading weights" in spoken.stderr  # transformers' load bar
    assert "[transformers] Passing `generation_config` together with" in spoken.stderr  # its deprecation log
    assert foreign(spoken.stderr)  # and so stderr is no longer omni's alone
    quiet = omni(tmp_path, "speak", "--model", "ck", "Hello there.", "-o", "y.wav")
    assert foreign(quiet.stderr) == []


def test_python_warnings_are_ignored_unless_verbose_or_asked_for(tmp_path: Path) -> None:
    """A library's ``warnings.warn`` outside any quiet block: ignored by default, shown with
    --verbose, and the user's own ``-W``/``PYTHONWARNINGS`` choice wins over omni's."""
    code = (
        "import sys, warnings\n"
        "from omni_core.quiet import quiet_warnings, set_verbose\n"
        "set_verbose(sys.argv[1] == 'verbose')\n"
        "quiet_warnings()\n"
        "warnings.warn('a library deprecation', DeprecationWarning)\n"
        "warnings.warn('a library fallback')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}

    def run(mode: str, *flags: str) -> str:
        argv = [sys.executable, *flags, "-c", code, mode]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=True).stderr

    assert run("quiet") == ""
    assert "a library fallback" in run("verbose")
    shown = run("quiet", "-W", "always")
    assert "a library deprecation" in shown and "a library fallback" in shown
