"""The vLLM stage engine: an autoregressive stage of any model plugin, run on vLLM's engine.

The core builds it in the process that runs the stage, as it builds a model's own engine::

    engine = VllmStageEngine(model_dir, stage, stage.engine_options)   # vLLM's engine starts here
    for token_id in engine.run(iter([prompt]), params): ...           # streamed as vLLM makes them
    engine.close()

``engine_options`` are vLLM's own engine arguments (the fields of ``vllm.EngineArgs``:
``max_model_len``, ``gpu_memory_utilization``, ``tensor_parallel_size``, ``dtype``,
``enforce_eager``, ``max_num_seqs``, ``seed``, ...), checked by :meth:`option_problems` before any
process starts. The checkpoint is the stage's ``model_dir`` (weights and tokenizer).

Streaming: each request is added to vLLM's ``LLMEngine`` with ``RequestOutputKind.DELTA`` and
the engine is stepped (``step()``) until the request finishes, yielding each step's new token ids
as they come: the first token reaches the client while the rest are being made. When the
consumer stops early (the generator is closed: a cancelled request, a client gone), the request
is aborted in vLLM. ``for_output`` answers the text vLLM detokenized for each token (stop
strings cut, never half a character).

Importing this module imports neither vLLM nor torch: the core loads the class in the
orchestrator's process to call :meth:`option_problems`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import difflib
import enum
import functools
import json
import logging
import os
import threading
import types
import typing
import uuid
import warnings
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omni_plugin_llm.text import prompt_ids

from omni_core.errors import ChatRequestError, ModelLoadError, PipelineConfigError
from omni_core.pipeline.stage import FinishReason, StageEngine

#: engine arguments omni sets itself: the stage's checkpoint is the model and the tokenizer
OMNI_SETS = ("model", "tokenizer")
#: the longest context a CPU engine gets unless ``max_model_len`` says otherwise (the model's
#: own limit when smaller): vLLM's default is the model's full context, which a CPU's KV cache
#: of a few GiB rarely holds
CPU_MAX_MODEL_LEN = 2048
#: GiB of KV cache vLLM's CPU build takes unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise
CPU_KVCACHE_GIB = "1"
#: ``max_tokens`` when neither the request nor the checkpoint's generation_config sets it (as
#: the model's own engine in omni-plugin-llm does: one stage reads a request the same way on
#: either engine)
DEFAULT_MAX_TOKENS = 256
#: request parameters and the types they take (``SamplingParams`` fields of the same name);
#: anything else is refused, not ignored
PARAMS: dict[str, tuple[type, ...]] = {
    "max_tokens": (int,),
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": (int,),
    "seed": (int,),
    "stop": (str, list),
    "ignore_eos": (bool,),
    "min_tokens": (int,),
    "repetition_penalty": (int, float),
    "presence_penalty": (int, float),
    "frequency_penalty": (int, float),
}
#: the environment a quiet start gives vLLM's processes (each only where the user set none):
#: vLLM's logging at ERROR, transformers' too, torch's C++ warnings and Python's warnings off
_QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "PYTHONWARNINGS": "ignore",
}
#: engine arguments that make vLLM start worker processes when above 1
_PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
#: a directory whose ``sitecustomize`` keeps vLLM's import-time log lines in the processes it
#: spawns (before vLLM configures its logging there)
_CHILD_SITE = Path(__file__).resolve().parent / "_child"


# -- quiet: vLLM's own output stays off an omni user's terminal --------------------------------


def quiet_wanted() -> bool:
    """Whether vLLM's logs and warnings are kept off the terminal: unless the user set
    ``VLLM_LOGGING_LEVEL`` (``INFO`` shows vLLM's own lines again). Errors always show."""
    return "VLLM_LOGGING_LEVEL" not in os.environ or os.environ.get("OMNI_VLLM_QUIET") == "1"


_env_lock = threading.RLock()


@contextlib.contextmanager
def quiet_vllm() -> Iterator[None]:
    """While vLLM imports and starts its engine (and spawns its processes, which inherit the
    environment as it is then): the quiet environment, this process's ``vllm`` logger at ERROR,
    transformers quiet and Python warnings ignored. Restored after, except the logger levels:
    vLLM configures its own logger once, at ERROR. Does nothing when the user set
    ``VLLM_LOGGING_LEVEL``."""
    if not quiet_wanted():
        yield
        return
    from omni_core.quiet import quiet_libraries

    with _env_lock:
        saved = {key: os.environ.get(key) for key in (*_QUIET_ENV, "PYTHONPATH", "OMNI_VLLM_QUIET")}
        for key, value in _QUIET_ENV.items():
            os.environ.setdefault(key, value)
        os.environ["OMNI_VLLM_QUIET"] = "1"  # our own setting, not the user's: quiet_wanted() stays true
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_CHILD_SITE), saved["PYTHONPATH"]) if p)
        vllm_logger = logging.getLogger("vllm")
        if vllm_logger.level < logging.ERROR:  # before vLLM configures it: what its modules log on import
            vllm_logger.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings(), quiet_libraries():
                warnings.simplefilter("ignore")
                yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


# -- engine options ------------------------------------------------------------------------------


@functools.cache
def _engine_fields() -> dict[str, Any]:
    """vLLM's engine arguments: each field of ``EngineArgs`` and its type (a string where vLLM
    names a type it imports only for type checkers)."""
    with quiet_vllm():
        from vllm.engine import arg_utils

    hints: dict[str, Any] = {}
    for field in dataclasses.fields(arg_utils.EngineArgs):
        hint = field.type
        if isinstance(hint, str):
            try:
                hint = eval(hint, vars(arg_utils))  # vLLM's own annotation, in its own module
            except Exception:
                pass  # a name only type checkers see: the type is not checked
        hints[field.name] = hint
    return hints


def _accepts(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits the type ``hint``; None when this cannot tell (vLLM decides)."""
    if hint is Any or isinstance(hint, (str, typing.TypeVar)):
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _accepts(value, args[0])
    if origin is typing.Union or origin is types.UnionType:
        answers = [_accepts(value, arg) for arg in args]
        return True if True in answers else (None if None in answers else False)
    if origin is typing.Literal:
        return value in args
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, set, frozenset, tuple, Sequence, collections.abc.Set):
        if not isinstance(value, (list, tuple, set, frozenset)):
            return False
        if origin is not tuple and len(args) == 1:
            answers = [_accepts(item, args[0]) for item in value]
            return False if False in answers else (None if None in answers else True)
        return True
    if origin in (dict, Mapping, collections.abc.Mapping) or hint in (dict, Mapping):
        return isinstance(value, dict)
    if hint in (list, tuple, set, frozenset):
        return isinstance(value, (list, tuple, set, frozenset))
    if isinstance(hint, type):
        if issubclass(hint, enum.Enum):
            return isinstance(value, hint) or value in {m.name for m in hint} or value in {m.value for m in hint}
        if dataclasses.is_dataclass(hint) or hasattr(hint, "model_fields"):  # a config section: a dict of its fields
            return isinstance(value, (dict, hint))
        return isinstance(value, hint) or None
    return None


def _literals(hint: Any) -> list[str]:
    """The string values a ``Literal`` (or a union holding one) allows."""
    if typing.get_origin(hint) is typing.Literal:
        return [v for v in typing.get_args(hint) if isinstance(v, str)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [v for arg in typing.get_args(hint) for v in _literals(arg)]
    return []


def _type_name(hint: Any) -> str:
    """A type as an option's problem names it: ``int``, ``one of 'auto', 'half', ...``."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    if typing.get_origin(hint) is typing.Literal:
        values = [repr(v) for v in typing.get_args(hint)]
        return "one of " + ", ".join(values[:8]) + (f" (and {len(values) - 8} more)" if len(values) > 8 else "")
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    return text if len(text) <= 100 else text[:97] + "..."


def option_problems(options: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``options`` as vLLM engine arguments: an unknown name (with the
    closest accepted ones), a value of the wrong type, a field omni sets itself. Imports vLLM's
    ``EngineArgs`` (a few seconds, once) unless there is nothing to check."""
    if not options:
        return []
    from omni_plugin_vllm.probe import installed_vllm

    if installed_vllm() is None:
        return ["vLLM is not installed, so its engine arguments cannot be checked (see `omni explain pipeline`)"]
    fields = _engine_fields()
    accepted = sorted(name for name in fields if not name.startswith("_") and name not in OMNI_SETS)
    problems = []
    for name, value in options.items():
        if name in OMNI_SETS:
            problems.append(f"{name!r} is the stage's checkpoint directory, which omni sets: remove it")
            continue
        if name not in fields or name.startswith("_"):
            close = difflib.get_close_matches(name, accepted, n=3, cutoff=0.65)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "see vLLM's EngineArgs"
            problems.append(f"{name!r} is not a vLLM engine argument: {hint}")
            continue
        if _accepts(value, fields[name]) is False:
            problem = f"{name!r} takes {_type_name(fields[name])}, got {type(value).__name__} {value!r}"
            close = difflib.get_close_matches(value, _literals(fields[name]), n=1) if isinstance(value, str) else []
            problems.append(problem + (f": did you mean {close[0]!r}?" if close else ""))
    return problems


def _context_length(model_dir: Path) -> int | None:
    """The model's own context limit, from its ``config.json`` (None when it names none)."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _default_max_tokens(model_dir: Path) -> int:
    """The checkpoint's ``generation_config.json`` ``max_new_tokens``, else :data:`DEFAULT_MAX_TOKENS`."""
    try:
        config = json.loads((model_dir / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DEFAULT_MAX_TOKENS
    value = config.get("max_new_tokens") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else DEFAULT_MAX_TOKENS


def engine_arguments(model_dir: Path, options: Mapping[str, Any], *, on_cpu: bool) -> dict[str, Any]:
    """vLLM's engine arguments for a stage: the checkpoint, omni's defaults, then ``options``.
    Defaults: no periodic stats logging; quiet weight loading; on the CPU, eager execution (no
    compilation at start-up) and a context of :data:`CPU_MAX_MODEL_LEN` at most."""
    arguments: dict[str, Any] = {"model": str(model_dir), "tokenizer": str(model_dir), "disable_log_stats": True}
    if quiet_wanted():
        arguments["use_tqdm_on_load"] = False
    if on_cpu:
        arguments["enforce_eager"] = True
        limit = _context_length(model_dir)
        arguments["max_model_len"] = min(CPU_MAX_MODEL_LEN, limit) if limit else CPU_MAX_MODEL_LEN
    arguments.update(options)
    return arguments


def _engine_core_in_process(options: Mapping[str, Any]) -> bool:
    """Whether vLLM's engine core runs in this process (else in a process of its own, vLLM's
    default). A daemonic process (how omni starts stage processes) may not start processes,
    so there the engine core runs in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set for the
    process), which also rules out vLLM's worker processes: one device only."""
    import multiprocessing

    if not multiprocessing.current_process().daemon:
        return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    parallel = {k: options[k] for k in _PARALLEL if isinstance(options.get(k), int) and options[k] > 1}
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0" or parallel:
        asked = ", ".join(f"{k}={v}" for k, v in parallel.items()) or "VLLM_ENABLE_V1_MULTIPROCESSING=1"
        raise ModelLoadError(
            f"{asked} needs vLLM to start processes of its own, and this stage runs in a daemonic process, "
            "which may not: run the stage on one device (drop the option), or place it in a process of its own"
        )
    return True


# -- requests ------------------------------------------------------------------------------------


def _check_params(params: Mapping[str, Any]) -> None:
    unknown = [k for k in params if k not in PARAMS]
    if unknown:
        raise ChatRequestError(
            f"the vLLM stage takes no parameter {', '.join(repr(k) for k in unknown)}; it takes {', '.join(PARAMS)}",
            field=unknown[0],
        )
    for key, value in params.items():
        kinds = PARAMS[key]
        ok = value is None or (isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds))
        if ok and key == "stop" and isinstance(value, list):
            ok = all(isinstance(s, str) for s in value)
        if not ok:
            wanted = "a string or a list of strings" if key == "stop" else " or ".join(k.__name__ for k in kinds)
            raise ChatRequestError(f"{key} must be {wanted}, got {type(value).__name__} {value!r}", field=key)
    stop = params.get("stop")
    if stop is not None and any(not s for s in ([stop] if isinstance(stop, str) else stop)):
        raise ChatRequestError("stop strings must not be empty", field="stop")


class VllmStageEngine(StageEngine):
    """Runs an ``ar`` stage on vLLM: items are token ids, :meth:`for_output` their text."""

    #: vLLM runs its engine core (and, across devices, its workers) in processes of its own:
    #: omni starts this stage's process non-daemonic, so it may
    starts_processes = True

    def __init__(self, model_dir: Path, stage: Any, options: dict[str, Any]) -> None:
        super().__init__(model_dir, stage, options)
        problems = option_problems(options)
        if problems:
            raise PipelineConfigError(
                f"stage {getattr(stage, 'name', '?')!r}: engine_options for vLLM: " + "; ".join(problems),
                field="engine_options",
            )
        self.in_process = _engine_core_in_process(options)
        with quiet_vllm():
            from multiprocessing import resource_tracker

            # this process's resource tracker starts in the quiet environment too: at exit it
            # otherwise warns about shared memory vLLM's engine client left registered
            resource_tracker.ensure_running()
            from vllm import EngineArgs, LLMEngine
            from vllm.platforms import current_platform

            on_cpu = bool(current_platform.is_cpu())
            if on_cpu:
                os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
            self.arguments = engine_arguments(self.model_dir, options, on_cpu=on_cpu)
            try:
                self._engine: Any = LLMEngine.from_engine_args(EngineArgs(**self.arguments))
            except Exception as exc:
                raise ModelLoadError(
                    f"vLLM could not start its engine for {self.model_dir}: {type(exc).__name__}: {exc} "
                    "(set VLLM_LOGGING_LEVEL=INFO to see vLLM's own output)"
                ) from exc
        self.tokenizer = self._engine.get_tokenizer()
        self.default_max_tokens = _default_max_tokens(self.model_dir)
        #: the current request's (token id, its text) in yield order, for for_output
        self._texts: collections.deque[tuple[int, str]] = collections.deque()
        self._fallback: _Detokenizer | None = None

    # -- the contract ---------------------------------------------------------------------------

    @classmethod
    def option_problems(cls, options: dict[str, Any]) -> list[str]:
        """What is wrong with ``options`` as vLLM engine arguments (none: an empty list)."""
        return option_problems(options)

    def run(self, inputs: Iterator[Any], params: dict[str, Any]) -> Generator[int, None, FinishReason]:
        """Stream one request's token ids as vLLM makes them; returns how the answer ended, as
        vLLM's own ``finish_reason`` says (``length``: ``max_tokens`` ran out; else ``stop``)."""
        items = list(inputs)
        if len(items) != 1:
            raise ChatRequestError(
                f"the vLLM stage takes one input (a prompt, chat messages or token ids), got {len(items)} items"
            )
        _check_params(params)
        prompt = self._engine_input(items[0])
        sampling = self._sampling(params)
        self._texts.clear()
        self._fallback = None
        engine = self._engine
        rid = f"omni-{uuid.uuid4().hex[:16]}"
        try:
            engine.add_request(rid, prompt, sampling)
        except _refusals() as exc:  # a prompt longer than the context, ...
            raise ChatRequestError(f"vLLM refused the request: {exc}") from None
        finished = False
        reason: FinishReason = "stop"
        try:
            while not finished and engine.has_unfinished_requests():
                for output in engine.step():
                    if output.request_id != rid:
                        continue
                    finished = bool(output.finished)
                    for completion in output.outputs:
                        if getattr(completion, "finish_reason", None) == "length":
                            reason = "length"
                        ids = [int(t) for t in completion.token_ids]
                        text = completion.text or ""
                        for n, token in enumerate(ids):
                            self._texts.append((token, text if n == len(ids) - 1 else ""))
                        for token in ids:
                            yield token
        finally:
            if not finished:  # the consumer stopped early, or stepping failed: free vLLM's slot
                with contextlib.suppress(Exception):
                    engine.abort_request([rid])
        return reason

    def for_output(self, item: Any) -> str:
        """The text of one token id, as vLLM detokenized it (empty while a character or a
        possible stop string is incomplete)."""
        if self._texts and self._texts[0][0] == item:
            return self._texts.popleft()[1]
        if self._fallback is None:  # an id not from run's order: decode it ourselves
            self._fallback = _Detokenizer(self.tokenizer)
        return self._fallback.piece(int(item))

    def close(self) -> None:
        engine, self._engine = getattr(self, "_engine", None), None
        if engine is None:
            return
        shutdown = getattr(engine, "shutdown", None) or getattr(engine.engine_core, "shutdown", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):
                shutdown()

    # -- helpers --------------------------------------------------------------------------------

    def _engine_input(self, prompt: Any) -> Any:
        """What vLLM's engine takes for a prompt string, chat messages or token ids."""
        if isinstance(prompt, Mapping) and ("prompt" in prompt or "prompt_token_ids" in prompt):
            raw: Any = dict(prompt)
        elif isinstance(prompt, str):
            raw = {"prompt": prompt}
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            raw = {"prompt_token_ids": list(prompt)}
        elif isinstance(prompt, list) and prompt:
            # the causal-lm family's own reading of its stage input: the same ids as its engine
            raw = {"prompt_token_ids": prompt_ids(self.tokenizer, prompt)}
        else:
            raise ChatRequestError(
                f"the vLLM stage takes a prompt string, chat messages or token ids, got {type(prompt).__name__}"
            )
        try:  # as vLLM's own LLM.generate hands prompts to the engine (its renderer)
            from vllm.renderers.inputs.preprocess import parse_model_prompt

            renderer = self._engine.renderer
            (engine_input,) = renderer.render_cmpl(
                [parse_model_prompt(self._engine.model_config, raw)], renderer.default_cmpl_tok_params
            )
            return engine_input
        except (ImportError, AttributeError):  # another vLLM: it takes the prompt as is
            return raw
        except _refusals() as exc:  # a prompt longer than the context, ...
            raise ChatRequestError(f"vLLM refused the request: {exc}") from None

    def _sampling(self, params: Mapping[str, Any]) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        given = {k: v for k, v in params.items() if v is not None}
        given.setdefault("max_tokens", self.default_max_tokens)
        temperature = float(given.pop("temperature", 0.0))
        stop = given.pop("stop", None)
        fields: dict[str, Any] = {
            "temperature": temperature,
            "output_kind": RequestOutputKind.DELTA,
            **given,
        }
        if stop:
            fields["stop"] = [stop] if isinstance(stop, str) else list(stop)
        try:
            return SamplingParams(**fields)
        except _refusals() as exc:  # vLLM's own range checks
            raise ChatRequestError(f"vLLM refused the request's parameters: {exc}") from None


def _refusals() -> tuple[type[BaseException], ...]:
    """The exceptions by which vLLM refuses a request (its client errors, and plain ValueError
    or TypeError from its checks): the request's fault, not the stage's."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError, TypeError)
    return (ValueError, TypeError, VLLMClientError)


class _Detokenizer:
    """Incremental text of token ids decoded one by one, never half a character: the text of
    the ids since the last complete piece, minus what was already answered."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def piece(self, token: int) -> str:
        self.ids.append(token)
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=True)
        before = decode(self.ids[self.prefix : self.read])
        after = decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]
