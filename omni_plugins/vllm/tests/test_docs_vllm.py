"""The command blocks of docs/vllm.md and docs/models/llm.md that need vLLM run, and print what
the pages show.

``tests/test_docs_commands.py`` runs every page's blocks in ``.venv``, which has no vLLM; a
block that needs it says ``<!-- not run: run by omni_plugins/vllm/tests/test_docs_vllm.py -->``
and this test runs it here, in ``.venv-vllm`` (``make test`` runs this suite there), through the
same machinery (``tests/docblocks.py``: markers, setup, private ``/tmp``, the matching rule).
Where vLLM is absent the blocks are skipped, saying so; the pages are still checked to carry
such blocks.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))

import docblocks  # noqa: E402  (tests/docblocks.py, after its directory is on the path)

pytestmark = pytest.mark.slow

#: the marker of the blocks this test runs (one of docblocks.NOT_RUN_REASONS)
MARKER = "run by omni_plugins/vllm/tests/test_docs_vllm.py"
PAGES = (REPO / "docs" / "vllm.md", REPO / "docs" / "models" / "llm.md")
BLOCKS = [
    block
    for page in PAGES
    for block in docblocks.page_blocks(page)[0]
    if block.not_run is not None and block.not_run.startswith(MARKER)
]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> docblocks.Session:
    return docblocks.Session(tmp_path_factory.mktemp("docs-vllm-session"))


def test_the_marker_is_an_allowed_reason_and_each_page_has_such_blocks() -> None:
    assert MARKER in docblocks.NOT_RUN_REASONS
    assert {block.page for block in BLOCKS} == set(PAGES), [block.id for block in BLOCKS]


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here: these blocks run in .venv-vllm (make test)")
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_vllm_block_prints_what_the_doc_shows(
    block: docblocks.Block, tmp_path: Path, session: docblocks.Session, monkeypatch: pytest.MonkeyPatch
):
    # the commands see a user's environment: no VLLM_* setting another test of this session made
    # (conftest's engine sets VLLM_ENABLE_V1_MULTIPROCESSING=0 while it lives)
    for name in [n for n in os.environ if n.startswith("VLLM_")]:
        monkeypatch.delenv(name)
    # the commands are this venv's: the omni that sees vLLM
    assert docblocks.BIN == Path(sys.executable).parent
    assert (docblocks.BIN / "omni").is_file(), f"no omni in {docblocks.BIN}"
    tmp = tmp_path / "t"
    tmp.mkdir()
    problems = docblocks.run_block(block, tmp, session)
    assert not problems, f"{block.id} differs from what omni prints:\n\n" + "\n\n".join(problems)
