"""Runs first in each process vLLM spawns while omni starts its engine quietly (this directory
leads ``PYTHONPATH`` then, and only then): vLLM configures its logging only after its modules are
imported, so what they log while importing (``Triton is installed, but doesn't include CPU
backend``) would reach the terminal through Python's last-resort handler. Below ERROR, nothing
of the ``vllm`` logger gets out before vLLM's own configuration (``VLLM_LOGGING_LEVEL=ERROR``)
takes over. Then the environment's own ``sitecustomize``, if it has one, runs as usual."""

import importlib.machinery
import importlib.util
import logging
import os
import sys

logging.getLogger("vllm").setLevel(logging.ERROR)


def _run_next() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_run_next()
