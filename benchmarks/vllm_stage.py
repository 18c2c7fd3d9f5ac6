#!/usr/bin/env python3
"""vLLM stage benchmark: tokens per second of an ar stage run on vLLM by omni, against calling
vLLM directly (``LLM.generate``) on the same checkpoint, side by side in one run.

Run with the vLLM venv (``scripts/bootstrap-vllm.sh`` makes it; ``omni-plugin-vllm`` and
``omni-plugin-llm`` installed, vLLM's CPU build here)::

    .venv-vllm/bin/python benchmarks/vllm_stage.py                  # about 3 minutes on 2 CPUs
    .venv-vllm/bin/python benchmarks/vllm_stage.py --quick          # about 2 minutes
    .venv-vllm/bin/python benchmarks/vllm_stage.py --json /tmp/vllm_stage.json --max-tokens 256

What it does: writes omni-plugin-llm's tiny Qwen2ForCausalLM (float32, random weights) into a
temporary directory, then starts, in this one run, four ways of running it on vLLM with the
same engine arguments (``dtype`` float32, ``max_model_len`` 512, eager, seed 0):

* **direct**: ``vllm.LLM`` in this process (vLLM's engine core in a process of its own, its
  default), one ``LLM.generate([prompt])`` per prompt;
* **stage engine**: :class:`omni_plugin_vllm.engine.VllmStageEngine` in this process (the
  same engine core placement as direct), ``run`` iterated to the end per prompt and
  ``for_output`` called on every token, as a stage loop does: the wrapper's own cost
  (stepping vLLM's engine with streamed deltas instead of ``LLM.generate``);
* **omni pipeline**: ``Omni(model)`` with the model's ``generate`` stage on vLLM, in a stage
  process of its own (the built-in placement), ``Omni.run`` per prompt: what an omni user
  gets, the orchestrator, the connectors and the stage loop included. The engine declares
  ``starts_processes``, so omni starts its stage process non-daemonic (in a process group of
  its own) and vLLM's engine core runs in a process of its own there, as in direct;
* **omni pipeline, stage inprocess**: the same with ``placement: inprocess`` for the stage (a
  thread of this process), where vLLM's engine core runs in a process of its own, as direct.

Each way gets the same prompts (``--prompts``, different texts), one at a time (a stage runs
its requests one after the other), with the same ``max_tokens`` and ``ignore_eos`` (every
request makes exactly ``max_tokens`` tokens) and greedy decoding; the answers (their text)
are checked equal across the ways. A round times every way once over all prompts; rounds
rotate the order, and the figure of each way is its median over ``--repeats`` rounds, after a
warm-up round. tokens/s = tokens made / wall time of the round. Ratios are speeds, way / direct.

Beside them, informational: **direct, batched**: one ``LLM.generate(all prompts)`` (vLLM
batching them), which no one-request-at-a-time stage can match; it shows what batching
requests inside a stage would be worth.

It is a measurement, not a test: the exit code is 0 whatever the figures (non-zero only when
something fails). The table ends with the goal (an omni pipeline at least 0.9x direct, for
each placement) and PASS or FAIL; the figures vary with the load on the machine, which the
header reports.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import finish, load_average, say

#: the engine arguments every way shares (the stage's ``engine_options``)
ENGINE_OPTIONS: dict[str, Any] = {"dtype": "float32", "max_model_len": 512, "seed": 0}
PROMPTS = (
    "Hello, how are you?",
    "Say something short.",
    "You are a tiny model with random weights.",
    "system user assistant",
    "I am a helpful assistant. Hello!",
    "How are you? Say something.",
    "Random weights say short things.",
    "Hello, tiny model.",
    "A helpful answer, please.",
    "Something short, you are.",
    "Tiny weights, short answers.",
    "Are you a model?",
)
#: the issue's goal: the omni pipeline's tokens/s at least this share of direct vLLM's
GOAL = 0.9


def version_of(module: str) -> str:
    try:
        return str(__import__(module).__version__)
    except Exception:
        return "absent"


class Direct:
    """``vllm.LLM``, one ``generate`` call per prompt."""

    name = "direct (LLM.generate)"

    def __init__(self, model_dir: Path) -> None:
        from omni_plugin_vllm.engine import quiet_vllm

        with quiet_vllm():  # the same quiet start the stage gets: vLLM's lines off the table
            from vllm import LLM

            self.llm = LLM(
                model=str(model_dir),
                tokenizer=str(model_dir),
                enforce_eager=True,
                use_tqdm_on_load=False,
                **ENGINE_OPTIONS,
            )

    def params(self, max_tokens: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    def run(self, prompts: list[str], max_tokens: int) -> list[tuple[int, str]]:
        params = self.params(max_tokens)
        answers = []
        for prompt in prompts:
            (output,) = self.llm.generate([prompt], params, use_tqdm=False)
            answers.append((len(output.outputs[0].token_ids), output.outputs[0].text))
        return answers

    def batched(self, prompts: list[str], max_tokens: int) -> list[tuple[int, str]]:
        outputs = self.llm.generate(list(prompts), self.params(max_tokens), use_tqdm=False)
        return [(len(o.outputs[0].token_ids), o.outputs[0].text) for o in outputs]

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


class StageEngine:
    """The stage engine class itself, driven as a stage loop drives it."""

    name = "stage engine (VllmStageEngine)"

    def __init__(self, model_dir: Path) -> None:
        from types import SimpleNamespace

        from omni_plugin_vllm.engine import VllmStageEngine

        self.engine = VllmStageEngine(model_dir, SimpleNamespace(name="generate"), dict(ENGINE_OPTIONS))

    def run(self, prompts: list[str], max_tokens: int) -> list[tuple[int, str]]:
        answers = []
        for prompt in prompts:
            pieces = [
                self.engine.for_output(token)
                for token in self.engine.run(iter([prompt]), {"max_tokens": max_tokens, "ignore_eos": True})
            ]
            answers.append((len(pieces), "".join(pieces)))
        return answers

    def close(self) -> None:
        self.engine.close()


class Pipeline:
    """``Omni(model)``: the generate stage on vLLM in a stage process."""

    name = "omni pipeline (Omni.run)"
    placement: str | None = None

    def __init__(self, model_dir: Path) -> None:
        from omni_core.api import Omni

        stages: dict[str, Any] = {"generate": {"engine": "vllm", "engine_options": dict(ENGINE_OPTIONS)}}
        if self.placement:
            stages["generate"]["placement"] = self.placement
        self.omni = Omni(model_dir, stages=stages)
        stage = self.omni.pipeline.resolved.stage("generate")
        self.placement, self.engine_name = stage.placement, stage.engine_name

    def run(self, prompts: list[str], max_tokens: int) -> list[tuple[int, str]]:
        answers = []
        for prompt in prompts:
            result = self.omni.run(prompt, params={"generate": {"max_tokens": max_tokens, "ignore_eos": True}})
            pieces = result.outputs["text"]  # one text piece per token
            answers.append((len(pieces), "".join(pieces)))
        return answers

    def close(self) -> None:
        self.omni.close()


class PipelineInprocess(Pipeline):
    """The same with the stage placed ``inprocess``: a thread of this process, vLLM's engine core
    in a process of its own."""

    name = "omni pipeline, stage inprocess"
    placement = "inprocess"


def measure(ways: list[Any], prompts: list[str], max_tokens: int, repeats: int) -> dict[str, Any]:
    """Per way: tokens/s of each round, their median, and the check that the answers agree
    (their texts: the same greedy decoding, token for token)."""
    rates: dict[str, list[float]] = {w.name: [] for w in ways}
    answers: dict[str, list[tuple[int, str]]] = {}
    for w in ways:  # warm-up round, untimed: the first request of an engine pays its set-up
        answers[w.name] = w.run(prompts[:2], max_tokens)
    for r in range(repeats):
        order = ways[r % len(ways) :] + ways[: r % len(ways)]
        for w in order:
            start = time.perf_counter()
            got = w.run(prompts, max_tokens)
            elapsed = time.perf_counter() - start
            tokens = sum(n for n, _ in got)
            if tokens != max_tokens * len(prompts):
                raise RuntimeError(f"{w.name} made {tokens} tokens, expected {max_tokens * len(prompts)}")
            answers[w.name] = got
            rates[w.name].append(tokens / elapsed)
        say(
            f"  round {r + 1}/{repeats}: " + ", ".join(f"{w.name.split(' (')[0]} {rates[w.name][-1]:.0f}" for w in ways)
        )
    reference = answers[ways[0].name]
    same = {name: a == reference for name, a in answers.items()}
    return {
        name: {"tokens_per_s": statistics.median(values), "rounds": values, "same_answers_as_direct": same[name]}
        for name, values in rates.items()
    }


def print_report(report: dict[str, Any]) -> None:
    say("")
    say(
        f"vLLM stage vs vLLM direct: {report['prompts']} prompts x {report['max_tokens']} tokens (ignore_eos, greedy), "
        f"one request at a time, median of {report['repeats']} rounds"
    )
    say(
        f"machine: {report['platform']}, {report['cpus']} CPUs, load {report['load_average']['before']} -> "
        f"{report['load_average']['after']}; vllm {report['vllm']}, torch {report['torch']}, "
        f"python {report['python']}"
    )
    direct = report["ways"][Direct.name]["tokens_per_s"]
    width = max(len(n) for n in report["ways"]) + 2
    say("")
    say(f"  {'way':<{width}} {'tokens/s':>9} {'vs direct':>10} {'same answers':>13}   rounds (tokens/s)")
    for name, figures in report["ways"].items():
        rounds = " ".join(f"{v:.0f}" for v in figures["rounds"])
        same = "yes" if figures["same_answers_as_direct"] else "NO"
        ratio = figures["tokens_per_s"] / direct
        say(f"  {name:<{width}} {figures['tokens_per_s']:9.1f} {ratio:9.2f}x {same:>13}   {rounds}")
    batched = report["batched_tokens_per_s"]
    say(f"  {'(direct, batched: informational)':<{width}} {batched:9.1f} {batched / direct:9.2f}x")
    say("")
    say("  start-up: " + ", ".join(f"{k} {v:.1f} s" for k, v in report["startup_s"].items()))
    same = all(f["same_answers_as_direct"] for f in report["ways"].values())
    report["goal"] = {"target": GOAL, "same_answers": same}
    for way in (Pipeline, PipelineInprocess):
        ratio = report["ways"][way.name]["tokens_per_s"] / direct
        verdict = "PASS" if ratio >= GOAL and same else "FAIL"
        say(f"goal: {way.name} >= {GOAL}x direct vLLM, same answers: {ratio:.2f}x -> {verdict}")
        report["goal"][way.name] = {"ratio": ratio, "verdict": verdict}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts and rounds (about 1 minute)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--prompts", type=int, help=f"prompts per round (default 8; --quick 4; at most {len(PROMPTS)})")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request (128)")
    parser.add_argument("--repeats", type=int, help="timed rounds (default 5; --quick 3)")
    args = parser.parse_args(argv)
    n_prompts = min(args.prompts or (4 if args.quick else 8), len(PROMPTS))
    repeats = args.repeats or (3 if args.quick else 5)
    prompts = list(PROMPTS[:n_prompts])

    started = time.perf_counter()
    load_before = load_average()
    home = Path(tempfile.mkdtemp(prefix="omni-bench-vllm-"))
    os.environ["OMNI_CACHE_DIR"] = str(home / "cache")
    os.environ["OMNI_CONFIG_DIR"] = str(home / "config")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine: three engines run at once

    from omni_plugin_llm.model import CausalLM

    model_dir = CausalLM.make_tiny(home / "tiny-llm", seed=0)
    ways: list[Any] = []
    startup: dict[str, float] = {}
    try:
        for cls in (Direct, StageEngine, Pipeline, PipelineInprocess):
            say(f"[setup] starting {cls.name}")
            t = time.perf_counter()
            ways.append(cls(model_dir))
            startup[cls.name.split(" (")[0]] = time.perf_counter() - t
        say(f"[run] {repeats} rounds of {n_prompts} prompts x {args.max_tokens} tokens, every way")
        figures = measure(ways, prompts, args.max_tokens, repeats)
        t = time.perf_counter()
        batched = ways[0].batched(prompts, args.max_tokens)
        batched_rate = sum(n for n, _ in batched) / (time.perf_counter() - t)
    finally:
        for way in ways:
            way.close()
        shutil.rmtree(home, ignore_errors=True)

    import torch

    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": version_of("vllm"),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average": {"before": load_before, "after": load_average()},
        "prompts": n_prompts,
        "max_tokens": args.max_tokens,
        "repeats": repeats,
        "engine_options": ENGINE_OPTIONS,
        "startup_s": startup,
        "ways": figures,
        "batched_tokens_per_s": batched_rate,
    }
    print_report(report)
    report["seconds"] = time.perf_counter() - started
    finish(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
