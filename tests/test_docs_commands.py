"""Every command shown in README.md and docs/ runs, and prints the lines the doc shows.

One parametrised case per command block (``tests/docblocks.py`` says what a block is, how the
doc marks blocks that cannot run here, and the matching rule). The commands run with this
interpreter's environment (the repo ``.venv``: torch and every plugin of the repository), in a
private ``/tmp`` with a private ``OMNI_CONFIG_DIR`` / ``OMNI_CACHE_DIR``.

A block that cannot run here says why with ``<!-- not run: REASON -->``, REASON from a short list
(:data:`docblocks.NOT_RUN_REASONS`); its ``omni`` commands are still checked: each names a real
command and only options that command takes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from docblocks import (
    BIN,
    NOT_RUN_REASONS,
    Block,
    Session,
    all_blocks,
    run_block,
)

pytestmark = pytest.mark.slow

BLOCKS = all_blocks()
KNOWN_MARKERS = {"not run", "setup", "run with", "with server"}
OMNI = BIN / "omni"


def _runnable(block: Block) -> bool:
    return block.not_run is None


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(tmp_path_factory.mktemp("docs-session"))


@pytest.mark.parametrize("block", [b for b in BLOCKS if _runnable(b)], ids=lambda b: b.id)
def test_command_block_prints_what_the_doc_shows(block: Block, tmp_path: Path, session: Session):
    tmp = tmp_path / "t"
    tmp.mkdir()
    problems = run_block(block, tmp, session)
    assert not problems, f"{block.id} differs from what omni prints:\n\n" + "\n\n".join(problems)


# -- blocks that do not run ----------------------------------------------------------------------


def test_every_marker_is_known_and_every_reason_allowed():
    bad = []
    for block in BLOCKS:
        for key in block.markers:
            if key not in KNOWN_MARKERS:
                bad.append(f"{block.id}: unknown marker {key!r} (known: {sorted(KNOWN_MARKERS)})")
        reason = block.not_run
        if reason is not None and not any(reason.startswith(allowed) for allowed in NOT_RUN_REASONS):
            bad.append(f"{block.id}: `not run: {reason}` is not an allowed reason: {sorted(NOT_RUN_REASONS)}")
    assert not bad, "\n".join(bad)


def test_the_unrun_blocks_are_few():
    # a marker is for what cannot run here, not for what is inconvenient to run
    unrun = [b for b in BLOCKS if not _runnable(b)]
    assert len(unrun) * 3 < len(BLOCKS), [b.id for b in unrun]


def _command_path(command: str) -> tuple[list[str], list[str]]:
    """(subcommand words, the --options used) of ``omni ...``."""
    words = command.replace("\\\n", " ").split()[1:]
    options = [w.split("=")[0].strip("[]") for w in words if w.lstrip("[").startswith("--")]
    path: list[str] = []
    for word in words:
        word = word.split("|")[0]  # a synopsis's alternatives: `disable|enable`
        if word.startswith("-"):
            if path or word.startswith("--"):
                continue
        if not re.fullmatch(r"[a-z][a-z0-9-]*", word):
            break
        path.append(word)
    return path, sorted(set(o for o in options if re.fullmatch(r"--[a-z][a-z0-9-]*", o)))


def _help(path: list[str]) -> tuple[int, str]:
    result = subprocess.run([str(OMNI), *path, "--help"], capture_output=True, text=True, check=False)
    return result.returncode, result.stdout


# the commands of a "run by" block come from the plugin its page builds: that test runs them
@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if not _runnable(b) and not b.not_run.startswith("run by")], ids=lambda b: b.id
)
def test_unrun_block_names_real_commands_and_options(block: Block):
    root_code, root_help = _help([])
    assert root_code == 0
    problems = []
    for command in block.omni_commands():
        path, options = _command_path(command)
        while path:
            code, text = _help(path)
            if code == 0:
                break
            path = path[:-1]  # the last word was an argument (FAMILY, NAME, ...)
        else:
            text = root_help
        if not path and command.split()[1] not in ("--version", "--help") and not command.split()[1].startswith("-"):
            problems.append(f"{command!r}: no such command")
        problems += [f"{command!r}: `omni {' '.join(path)}` has no {o}" for o in options if o not in text + root_help]
    assert not problems, f"{block.id}:\n" + "\n".join(problems)
