"""vLLM's own output stays off an omni user's terminal: its logging (INFO and WARNING lines,
from every process it starts), Python and C++ warnings, its load bar. Each test runs a fresh
interpreter, as a user's would be, and reads everything it prints. Needs vLLM."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/bootstrap-vllm.sh makes .venv-vllm)")

PROMPT = "Hello, how are you?"
#: a line of vLLM's logging format: ``(EngineCore pid=1) INFO 12-02 05:28:16 [core.py:133] ...``
VLLM_LOG = re.compile(r"\b(DEBUG|INFO|WARNING)\s+\d\d-\d\d \d\d:\d\d:\d\d\b")
#: what else vLLM and its libraries print when nobody quiets them
NOISE = ("Triton", "vllm", "vLLM", "Warning", "tcmalloc", "NUMA", "it/s]", "Loading safetensors")
#: lines that are not vLLM's (omni's own process handling); tolerated so this test judges vLLM only
NOT_VLLMS = ("resource_tracker", "warnings.warn('resource_tracker")


def run_quietly(code: str, tmp_path: Path) -> list[str]:
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(code), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "OMNI_VLLM"))}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    lines = (out.stdout + out.stderr).splitlines()
    assert out.returncode == 0, "\n".join(lines[-40:])
    return [line for line in lines if line.strip() and not any(n in line for n in NOT_VLLMS)]


def assert_quiet(lines: list[str], expected: set[str]) -> None:
    noisy = [
        line for line in lines if line not in expected and (VLLM_LOG.search(line) or any(n in line for n in NOISE))
    ]
    assert noisy == [], "\n".join(noisy)
    assert set(lines) == expected, "\n".join(lines)


def test_the_engine_with_processes_of_its_own_prints_nothing(tiny_llm: Path, tmp_path: Path) -> None:
    """The engine as an inprocess stage builds it: vLLM's engine core and worker in processes of
    their own (the most output vLLM makes). A request streams (its first token is out while vLLM
    still works on it), a closed stream aborts its request across the processes, and shutdown
    is prompt: all without a line of vLLM's."""
    lines = run_quietly(
        f"""
        import time
        from pathlib import Path
        from types import SimpleNamespace

        if __name__ == "__main__":
            from omni_plugin_vllm.engine import VllmStageEngine

            engine = VllmStageEngine(Path({str(tiny_llm)!r}), SimpleNamespace(name="generate"), {{"dtype": "float32"}})
            print("in process", engine.in_process)
            tokens = engine.run(iter(["Hello"]), {{"max_tokens": 2000, "ignore_eos": True}})
            first = [next(tokens) for _ in range(3)]
            print("streaming", engine._engine.has_unfinished_requests())
            tokens.close()
            print("aborted", not engine._engine.has_unfinished_requests())
            again = list(engine.run(iter(["Hello"]), {{"max_tokens": 3, "ignore_eos": True}}))
            print("same start", again == first)
            start = time.perf_counter()
            engine.close()
            print("closed within 15 s", time.perf_counter() - start < 15)
        """,
        tmp_path,
    )
    assert_quiet(
        lines,
        {"in process False", "streaming True", "aborted True", "same start True", "closed within 15 s True"},
    )


def test_a_pipeline_stage_on_vllm_prints_nothing(tiny_llm: Path, tmp_path: Path, reference: Any, greedy: Any) -> None:
    """omni's own way: the model's ``generate`` stage is chosen onto vLLM (its probe agrees and
    it outranks the model's own engine) and runs in a stage process, where vLLM's engine core
    runs in process (a stage process is daemonic). The text is transformers' greedy answer."""
    _, tokenizer = reference
    expected = tokenizer.decode(greedy(tokenizer(PROMPT)["input_ids"], 12), skip_special_tokens=True)
    lines = run_quietly(
        f"""
        from omni_core.api import Omni

        if __name__ == "__main__":
            with Omni({str(tiny_llm)!r}) as omni:
                print("chosen", omni.pipeline.resolved.stage("generate").engine_name)
                params = {{"generate": {{"max_tokens": 12, "ignore_eos": True}}}}
                result = omni.run({PROMPT!r}, params=params)
                print("text", ascii("".join(result.outputs["text"])))
        """,
        tmp_path,
    )
    assert_quiet(lines, {"chosen vllm", f"text {expected!a}"})
