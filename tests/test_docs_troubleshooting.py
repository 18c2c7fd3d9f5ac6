"""docs/troubleshooting.md is checked against the fault battery and the code.

* Every "battery row" it names exists: ``faults_X[ID]`` is a parametrised case ``ID`` or a test
  function ``ID`` of ``tests/test_faults_X.py``; so each failure the page describes is one the
  battery produces and checks (exit code, cause named, no traceback, nothing lost).
* Every message it quotes is one omni prints: each literal piece of a quote (the text between
  ``…`` and ``<placeholders>``) stands in omni's source or in what a battery row asserts.
* Every ``omni ...`` command it shows runs: the command exists and takes the options shown
  (``omni <command> --help`` lists them).
* Every battery file is represented: a new file of faults gets rows on the page.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "troubleshooting.md"
OMNI = Path(sys.executable).parent / "omni"
TESTS = REPO / "tests"

_ROW_REF = re.compile(r"`faults_(\w+)\[([^\]]+)\]`")
#: what stands for a value in a quote on the page, and in a message template in the source
_PLACEHOLDER = re.compile(r"…|<[^>]+>|\.\.\.")
_TEMPLATE_FIELD = re.compile(r"\{[^{}]*\}")
_CODE = re.compile(r"`([^`]+)`")


def _table_rows() -> list[list[str]]:
    rows = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("|") and not line.startswith("|---") and "battery row" not in line:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
            rows.append(cells)
    return rows


def _battery_ids(part: str) -> set[str]:
    """Test function names and parametrised ids of tests/test_faults_<part>.py."""
    path = TESTS / f"test_faults_{part}.py"
    assert path.is_file(), f"the page names a battery file that does not exist: {path.name}"
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    ).stdout
    ids: set[str] = set()
    for line in collected.splitlines():
        if "::" not in line:
            continue
        test = line.split("::", 1)[1]
        name, _, param = test.partition("[")
        ids.add(name)
        if param:
            ids.add(param.rstrip("]"))
    return ids


def _corpus() -> str:
    """omni's own source (where its messages are written) and the battery (what rows assert)."""
    roots = [REPO / "omni_core", REPO / "cli" / "omni_cli", *sorted((REPO / "omni_plugins").glob("*/omni_plugin_*"))]
    texts = [p.read_text(encoding="utf-8") for root in roots for p in root.rglob("*.py") if "build" not in p.parts]
    # a field of an f-string message is a value: it ends a literal piece, as a placeholder does
    return _TEMPLATE_FIELD.sub("\0", "\n".join(texts))


ROWS = _table_rows()


def test_the_page_has_rows_from_every_battery_file():
    parts = {m.group(1) for row in ROWS for m in _ROW_REF.finditer(row[-1])}
    files = {p.stem.removeprefix("test_faults_") for p in TESTS.glob("test_faults_*.py")}
    assert files <= parts, f"battery files with no row on the page: {sorted(files - parts)}"
    assert all(_ROW_REF.search(row[-1]) for row in ROWS), "every row names the battery rows that prove it"


@pytest.mark.parametrize("part", sorted({m.group(1) for row in ROWS for m in _ROW_REF.finditer(row[-1])}))
def test_every_battery_row_named_exists(part: str):
    ids = _battery_ids(part)
    named = {m.group(2) for row in ROWS for m in _ROW_REF.finditer(row[-1]) if m.group(1) == part}
    missing = sorted(named - ids)
    assert not missing, f"docs/troubleshooting.md names rows that tests/test_faults_{part}.py does not have: {missing}"


def test_every_quoted_message_is_one_omni_prints():
    corpus = _corpus()
    unknown = []
    for row in ROWS:
        for quote in _CODE.findall(row[1]):
            if quote.startswith("omni "):
                continue  # a command: test_every_command_shown_runs runs it
            for piece in _PLACEHOLDER.split(quote.replace("\\`", "`")):
                piece = piece.strip(" .;:,'")
                if len(piece) >= 10 and piece not in corpus:
                    unknown.append(piece)
    assert not unknown, f"quoted on the page but printed nowhere in omni: {unknown}"


def _commands() -> list[str]:
    found = []
    for row in ROWS:
        for cell in row[1:3]:
            for code in _CODE.findall(cell):
                if code.startswith("omni "):
                    found.append(code)
    text = PAGE.read_text(encoding="utf-8")
    found += [c for c in _CODE.findall(text.split("## ", 1)[0]) if c.startswith("omni ")]
    return sorted(set(found))


def _command_path(command: str) -> tuple[list[str], list[str]]:
    """(root options + subcommand words, the --options used) of ``omni ...``."""
    words = command.split()[1:]
    path: list[str] = []
    options = [w.split("=")[0] for w in words if w.startswith("--")]
    for word in words:
        if word.startswith("--"):
            continue
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break  # an argument (NAME, "PROMPT", ...): the command ends before it
        path.append(word)
    return path, options


@pytest.mark.parametrize("command", _commands())
def test_every_command_shown_runs(command: str):
    path, options = _command_path(command)
    result = subprocess.run([str(OMNI), *path, "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"`omni {' '.join(path)} --help` failed:\n{result.stdout}{result.stderr}"
    root_help = subprocess.run([str(OMNI), "--help"], capture_output=True, text=True, check=False).stdout
    for option in options:
        assert option in result.stdout or option in root_help, f"{command!r}: `omni {' '.join(path)}` has no {option}"
