"""Cache-DiT's DBCache (the ``cache-dit`` package, 1.5.x) behind omni's cache contract.

The method, per transformer call and per block list the family declares:

1. the first ``Fn_compute_blocks`` blocks always run; the **residual** they add to the list's
   input is compared with the one of the last computed step (relative L1 distance,
   ``mean|r - r_prev| / mean|r_prev|``);
2. under ``residual_diff_threshold`` the middle blocks are **skipped**: their output is the
   Fn blocks' output plus the residual the middle blocks added at the last computed step;
   otherwise they run and that residual is stored;
3. the last ``Bn_compute_blocks`` blocks always run. The first ``max_warmup_steps`` steps
   always compute, and ``max_cached_steps`` / ``max_continuous_cached_steps`` cap the reuse.

cache-dit is used in its **transformer-only** mode (a ``BlockAdapter`` with no pipeline): in its
pipeline mode it patches ``__call__`` on the pipeline *class*, so two open models of one class
would disturb each other. In this mode its cache context outlives a pipeline call, so
:meth:`CacheDitBackend.refresh` rebuilds it before every request: nothing computed for another
request (another prompt, size or seed) is ever reused.

Classifier-free guidance as two transformer calls per step (Wan, Qwen-Image, FLUX.1 with a
negative prompt) needs cache-dit's ``enable_separate_cfg``, or it counts the two calls as two
steps and compares a conditional residual with an unconditional one. Whether a request does
that depends on the request (its guidance scale, a negative prompt), not on the family, so the
backend finds out per request: a forward pre-hook on the transformer sees the second call
carry the first call's timestep, and switches the request's contexts to separate guidance
before that call runs. The first call is the same under both settings (it is never a guidance
step), so the switch is exact.

``cache_dit`` is imported in :meth:`CacheDitBackend.enable` only: discovering the plugin, and
checking options and declarations, import neither it nor torch. Its log lines (INFO, on
stdout) are kept off an omni user's terminal unless ``omni --verbose`` is given or
``CACHE_DIT_LOG_LEVEL`` is set.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omni_core.cache import CACHE_QUALITIES, CacheBackend, CacheConfigError, CacheQuality, CacheTarget, StepReport

#: cache-dit's ``ForwardPattern`` names (checked without importing it; a test keeps them equal):
#: what a block takes and returns, e.g. Pattern_1 takes (hidden_states, encoder_hidden_states)
#: and returns (encoder_hidden_states, hidden_states), Pattern_2 returns hidden_states only
FORWARD_PATTERNS: tuple[str, ...] = ("Pattern_0", "Pattern_1", "Pattern_2", "Pattern_3", "Pattern_4", "Pattern_5")

#: the declaration keys a family must give, and what each is
DECLARATION_KEYS = {
    "blocks": "the transformer's block-list attributes (ModuleLists), in the order they run",
    "forward_patterns": f"one cache-dit forward pattern per block list ({', '.join(FORWARD_PATTERNS)})",
}


@dataclass(frozen=True)
class _Option:
    """One ``--cache-config`` key: a field of cache-dit's ``DBCacheConfig``."""

    integer: bool
    minimum: float
    meaning: str
    default: str

    def takes(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} >= {self.minimum:g}"


#: ``--cache-config`` keys: the subset of cache-dit's ``DBCacheConfig`` omni passes through
OPTIONS: dict[str, _Option] = {
    "Fn_compute_blocks": _Option(True, 1, "the first blocks of each block list, always run", "8"),
    "Bn_compute_blocks": _Option(True, 0, "the last blocks of each block list, always run", "0"),
    "residual_diff_threshold": _Option(
        False,
        0,
        "the relative change of the first blocks' residual under which the middle blocks are reused: "
        "higher reuses more, 0 never reuses, 1 or more reuses every step the limits allow",
        "0.08",
    ),
    "max_warmup_steps": _Option(True, 0, "the first steps of a request, always computed", "8"),
    "max_cached_steps": _Option(True, -1, "at most this many reused steps per request, -1 for no limit", "-1"),
    "max_continuous_cached_steps": _Option(True, -1, "at most this many reused steps in a row, -1 for no limit", "-1"),
}


@dataclass(frozen=True)
class Profile:
    """The settings of one request: cache-dit's ``DBCacheConfig`` fields omni sets."""

    Fn_compute_blocks: int = 8
    Bn_compute_blocks: int = 0
    residual_diff_threshold: float = 0.08
    max_warmup_steps: int = 8
    max_cached_steps: int = -1
    max_continuous_cached_steps: int = -1

    def high(self) -> Profile:
        """``quality="high"``: half the threshold and twice the warmup (at least one more step)."""
        warmup = max(2 * self.max_warmup_steps, self.max_warmup_steps + 1)
        return dataclasses.replace(
            self, residual_diff_threshold=self.residual_diff_threshold / 2, max_warmup_steps=warmup
        )

    def lossless(self) -> Profile:
        """``quality="lossless"``: no step may be reused, so every block runs in order, as uncached."""
        return dataclasses.replace(self, max_cached_steps=0, residual_diff_threshold=0.0)


#: attributes cache-dit sets on the transformer and its block lists, removed on disable when
#: they were not there before enable (its own release misses none today; this is the guarantee)
_CACHE_DIT_ATTRIBUTES = frozenset(
    {
        "_context_manager",
        "_context_names",
        "_context_kwargs",
        "_original_forward",
        "_is_cached",
        "_forward_pattern",
        "_has_separate_cfg",
        "_cached_steps",
        "_residual_diffs",
        "_cfg_cached_steps",
        "_cfg_residual_diffs",
        "_accumulated_cached_steps",
        "_cfg_accumulated_cached_steps",
        "_accumulated_executed_steps",
        "_accumulated_transformer_executed_steps",
    }
)


@dataclass
class _RequestState:
    """What the backend follows of one request, beside cache-dit's own contexts."""

    calls: int = 0
    first_timestep: Any = None
    separate_cfg: bool = False


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _timestep_index(transformer: Any) -> int | None:
    """Where ``timestep`` sits among the transformer's positional arguments (None: unknown)."""
    try:
        parameters = list(inspect.signature(type(transformer).forward).parameters)
    except (TypeError, ValueError):
        return None
    return parameters.index("timestep") - 1 if "timestep" in parameters else None  # less self


def _quiet_cache_dit() -> Any:
    """Import cache_dit with its log lines (INFO and WARNING, on stdout) held back, unless the
    user asked to hear them (``omni --verbose``, or ``CACHE_DIT_LOG_LEVEL`` set)."""
    from omni_core.quiet import is_verbose

    chosen = "CACHE_DIT_LOG_LEVEL" in os.environ or is_verbose()
    import cache_dit

    if not chosen:
        cache_dit_logger = importlib.import_module("cache_dit.logger")
        # every cache_dit logger writes through this one handler, also those created later
        handler = getattr(cache_dit_logger, "_default_handler", None)
        if handler is not None:
            handler.setLevel(logging.ERROR)
    return cache_dit


class CacheDitBackend(CacheBackend):
    """cache-dit's DBCache on a diffusion transformer whose family declares its block lists."""

    def __init__(self, target: CacheTarget, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(target, options)
        declaration = target.declaration
        self.block_names: tuple[str, ...] = tuple(str(b) for b in declaration["blocks"])
        self.forward_patterns: tuple[str, ...] = tuple(str(p) for p in declaration["forward_patterns"])
        #: the profile asked for: cache-dit's defaults, overridden by the options
        self.asked = Profile(**{k: v for k, v in self.options.items() if k in OPTIONS})
        #: the profile in force (Fn/Bn fitted to the block lists by :meth:`enable`)
        self.profile = self.asked
        self._adapter: Any = None
        self._pre_hook: Any = None
        self._timestep_index: int | None = None
        self._own_forward: Any = None
        self._had_attributes: dict[int, set[str]] = {}
        self._request = _RequestState()

    # ------------------------------------------------------------------ declared, checked early

    @classmethod
    def option_problems(cls, options: Mapping[str, Any]) -> list[str]:
        problems = []
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            by_case = {k.casefold(): k for k in OPTIONS}
            meant = [f"{by_case[k.casefold()]!r} for {k!r}" for k in unknown if k.casefold() in by_case]
            hint = f" (did you mean {', '.join(meant)}? option names are cache-dit's, case included)" if meant else ""
            known = ", ".join(f"{k} ({o.takes()})" for k, o in OPTIONS.items())
            problems.append(f"unknown option(s) {', '.join(map(repr, unknown))}{hint}; cache_dit takes {known}")
        for key, option in OPTIONS.items():
            if key not in options:
                continue
            value = options[key]
            valid = _is_integer(value) if option.integer else _is_number(value)
            if not valid or value < option.minimum:
                problems.append(
                    f"{key} must be {option.takes()} ({option.meaning}; default {option.default}), not {value!r}"
                )
        return problems

    @classmethod
    def declaration_problems(cls, family: str, declaration: Mapping[str, Any]) -> list[str]:
        problems = [f"it lacks {key!r} ({what})" for key, what in DECLARATION_KEYS.items() if key not in declaration]
        if problems:
            return problems
        blocks, patterns = declaration["blocks"], declaration["forward_patterns"]
        if not isinstance(blocks, (list, tuple)) or not blocks or not all(isinstance(b, str) and b for b in blocks):
            problems.append("blocks must list the names of the transformer's block-list attributes")
        else:
            dotted = [b for b in blocks if "." in b]
            if dotted:
                problems.append(
                    f"blocks must be attributes of the transformer itself, not dotted paths ({', '.join(dotted)}): "
                    "cache-dit swaps each list on the transformer by its attribute name while it runs"
                )
            if len(set(blocks)) != len(blocks):
                problems.append("blocks must name each block list once")
        if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) for p in patterns):
            problems.append(f"forward_patterns must list pattern names ({', '.join(FORWARD_PATTERNS)})")
        else:
            wrong = [p for p in patterns if p not in FORWARD_PATTERNS]
            if wrong:
                problems.append(
                    f"forward pattern(s) {', '.join(map(repr, wrong))} are not cache-dit's "
                    f"(it has {', '.join(FORWARD_PATTERNS)})"
                )
            if isinstance(blocks, (list, tuple)) and len(patterns) != len(blocks):
                problems.append(
                    f"forward_patterns must give one pattern per block list: {len(blocks)} block list(s), "
                    f"{len(patterns)} pattern(s)"
                )
        return problems

    # ------------------------------------------------------------------ lifecycle

    def _refuse(self, problem: str) -> CacheConfigError:
        return CacheConfigError(f"cache backend 'cache_dit' cannot serve {self.target.family!r}: {problem}")

    def _block_lists(self) -> list[Any]:
        """The declared block lists, each checked to be a list cache-dit can split (before
        anything is installed)."""
        import torch

        transformer = self.target.transformer
        lists = []
        for name in self.block_names:
            blocks = getattr(transformer, name, None)
            if not isinstance(blocks, torch.nn.ModuleList):
                raise self._refuse(
                    f"the transformer ({type(transformer).__name__}) has no block list {name!r}, which the family "
                    "declares for cache_dit; report this to the family plugin's authors"
                )
            if len(blocks) < 2:
                raise self._refuse(
                    f"block list {name!r} has {len(blocks)} block(s); cache-dit needs at least 2 (one that always "
                    "runs, one it can skip)"
                )
            lists.append(blocks)
        return lists

    def _fit(self, lists: list[Any]) -> Profile:
        """Fn and Bn for the shortest block list, leaving at least one block between them to
        skip. The default Fn (8) shrinks to fit a short list; values the user gave are kept, and
        refused when they do not fit."""
        shortest, name = min((len(blocks), n) for blocks, n in zip(lists, self.block_names, strict=True))
        fn, bn = self.asked.Fn_compute_blocks, self.asked.Bn_compute_blocks
        if fn + bn < shortest:
            return self.asked
        if "Fn_compute_blocks" not in self.options and shortest - 1 - bn >= 1:
            return dataclasses.replace(self.asked, Fn_compute_blocks=shortest - 1 - bn)
        raise self._refuse(
            f"Fn_compute_blocks + Bn_compute_blocks must stay under {shortest}, the length of block list {name!r}, "
            f"so that a block is left to skip; they are {fn} + {bn}"
        )

    def _check_patterns(self, cache_dit: Any, lists: list[Any]) -> list[Any]:
        """Each list's blocks take and return what its declared pattern says (cache-dit skips its
        own check on a transformer that carries diffusers hooks, as one that has run does)."""
        patterns = []
        for name, pattern_name, blocks in zip(self.block_names, self.forward_patterns, lists, strict=True):
            pattern = cache_dit.ForwardPattern[pattern_name]
            if not cache_dit.BlockAdapter.match_blocks_pattern(
                blocks, pattern, logging=False, check_forward_pattern=True, check_num_outputs=True
            ):
                raise self._refuse(
                    f"the blocks of {name!r} ({type(blocks[0]).__name__}) do not take {pattern.In} and return "
                    f"{pattern.Out} as {pattern_name} says; report this to the family plugin's authors"
                )
            patterns.append(pattern)
        return patterns

    def _config(self, cache_dit: Any, profile: Profile, steps: int | None) -> Any:
        return cache_dit.DBCacheConfig(
            **dataclasses.asdict(profile), num_inference_steps=steps, enable_separate_cfg=False
        )

    def enable(self) -> None:
        if self.is_enabled():
            return
        try:
            cache_dit = _quiet_cache_dit()
        except ImportError as exc:
            raise self._refuse(
                f"the cache-dit package does not import ({exc}); install it with pip install 'cache-dit>=1.5,<1.6'"
            ) from exc
        transformer = self.target.transformer
        lists = self._block_lists()  # refusals here and below come before anything is installed
        patterns = self._check_patterns(cache_dit, lists)
        profile = self._fit(lists)
        self._own_forward = transformer.__dict__.get("forward")  # an instance-level forward someone else set
        self._had_attributes = {id(m): set(m.__dict__) for m in (transformer, *lists)}
        self._timestep_index = _timestep_index(transformer)
        adapter = cache_dit.BlockAdapter(
            pipe=None,  # transformer-only: cache-dit leaves the pipeline (and its class) alone
            transformer=transformer,
            blocks=lists,
            blocks_name=list(self.block_names),
            forward_pattern=patterns,
            check_forward_pattern=True,
            has_separate_cfg=False,
        )
        self._adapter = adapter
        try:
            cache_dit.enable_cache(adapter, cache_config=self._config(cache_dit, profile, None))
            self._pre_hook = transformer.register_forward_pre_hook(self._on_call, with_kwargs=True)
        except BaseException:
            self.disable()
            raise
        self.profile = profile

    def disable(self) -> None:
        adapter, self._adapter = self._adapter, None
        if self._pre_hook is not None:
            self._pre_hook.remove()
            self._pre_hook = None
        self._request = _RequestState()
        if adapter is None:
            return
        import cache_dit

        transformer = self.target.transformer
        try:
            try:
                cache_dit.disable_cache(adapter)
            except Exception:  # a half-made adapter (enable failed): release what the transformer holds
                cache_dit.disable_cache(transformer)
        finally:
            # cache-dit leaves its bound copy of the class's forward on the instance: the model
            # computes exactly as before only once the instance holds what it held before
            if self._own_forward is None:
                transformer.__dict__.pop("forward", None)
            else:
                transformer.forward = self._own_forward
            for module in (transformer, *(getattr(transformer, n, None) for n in self.block_names)):
                if module is None:
                    continue
                before = self._had_attributes.get(id(module), set())
                for attribute in _CACHE_DIT_ATTRIBUTES & (set(module.__dict__) - before):
                    delattr(module, attribute)
            self._own_forward, self._had_attributes = None, {}

    def is_enabled(self) -> bool:
        return self._adapter is not None

    def refresh(self, num_inference_steps: int, quality: CacheQuality | None = None) -> None:
        if quality is not None and quality not in CACHE_QUALITIES:
            raise ValueError(f"quality must be one of {', '.join(CACHE_QUALITIES)}, not {quality!r}")
        self._request = _RequestState()
        if not self.is_enabled():
            return
        import cache_dit

        profile = self.profile
        if quality == "high":
            profile = profile.high()
        elif quality == "lossless":
            profile = profile.lossless()
        # a new context for every block list: no residual of another request survives. Every
        # field is given, so nothing of the previous request's settings carries over either.
        config = self._config(cache_dit, profile, int(num_inference_steps))
        cache_dit.refresh_context(self.target.transformer, cache_config=config)

    def report(self) -> StepReport:
        """A step counts as reused when every block list skipped its middle blocks on it, in
        every guidance branch; a step any of them computed counts as computed."""
        if not self.is_enabled():
            return StepReport()
        steps = 0
        reused: set[int] | None = None
        for context in self._contexts():
            steps = max(steps, context.executed_steps)
            skipped = set(context.cached_steps)
            if self._request.separate_cfg:
                skipped &= set(context.cfg_cached_steps)
            reused = skipped if reused is None else reused & skipped
        done = reused or set()
        return StepReport(computed=[s for s in range(steps) if s not in done], reused=sorted(done))

    def describe(self) -> str:
        profile = self.profile
        parts = [
            f"Fn_compute_blocks={profile.Fn_compute_blocks}",
            f"Bn_compute_blocks={profile.Bn_compute_blocks}",
            f"residual_diff_threshold={profile.residual_diff_threshold:g}",
            f"max_warmup_steps={profile.max_warmup_steps}",
        ]
        for key in ("max_cached_steps", "max_continuous_cached_steps"):
            value = getattr(profile, key)
            if value >= 0:
                parts.append(f"{key}={value}")
        lists = len(self.block_names)
        return f"{', '.join(parts)}, {lists} block list{'s' if lists != 1 else ''} ({self.target.family})"

    # ------------------------------------------------------------------ cache-dit's state

    def _contexts(self) -> list[Any]:
        """The request's cache contexts, one per block list (cache-dit keeps them on the
        transformer in transformer-only mode)."""
        transformer = self.target.transformer
        manager = getattr(transformer, "_context_manager", None)
        names = getattr(transformer, "_context_names", None)
        if manager is None or not names:
            raise RuntimeError(
                "cache-dit keeps no cache context on the transformer: this backend reads cache-dit 1.5's "
                "contexts (install 'cache-dit>=1.5,<1.6')"
            )
        return [manager.get_context(name) for name in names]

    def _on_call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before each transformer call: a second call with the first call's timestep means the
        pipeline runs guidance as a second call per step; cache-dit is told before it runs."""
        state = self._request
        state.calls += 1
        if state.calls > 2:
            return
        timestep = kwargs.get("timestep")
        if timestep is None and self._timestep_index is not None and len(args) > self._timestep_index:
            timestep = args[self._timestep_index]
        if timestep is None or not hasattr(timestep, "shape"):
            return
        if state.calls == 1:
            state.first_timestep = timestep.detach().clone()
            return
        first = state.first_timestep
        if first is not None and first.shape == timestep.shape and bool((first == timestep).all()):
            state.separate_cfg = True
            for context in self._contexts():
                context.cache_config.enable_separate_cfg = True
