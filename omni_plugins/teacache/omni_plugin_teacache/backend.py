"""TeaCache (Timestep Embedding Aware Cache; Liu et al., 2024) behind omni's cache contract.

The method, per denoising step and per guidance branch:

1. take the step's **modulated input**: what the first transformer block feeds its attention,
   read by the family's extractor (:mod:`omni_plugin_teacache.extractors`) from that block's
   own arguments;
2. its relative L1 distance to the previous step's, ``mean|x - x_prev| / mean|x_prev|``,
   rescaled by the family's polynomial (``numpy.poly1d(coefficients)``, highest degree first),
   is added to an accumulator;
3. while the accumulator stays under ``rel_l1_thresh`` the block stack is **skipped**: the
   output is the stack's input plus the residual (output minus input) of the last computed
   step; once it reaches the threshold, the stack runs, the residual is stored and the
   accumulator is reset. The first ``warmup_steps`` steps (the family's declaration; 1 by
   default) always run, and so does the last one unless the family declares
   ``compute_last_step: false`` (as the published Wan "retention" mode does).

Everything around the block stack (embeddings, the final norm and projection) always runs.
The hooks are instance-level forward wrappers on the transformer's blocks and one forward
pre-hook on the transformer (to tell steps and guidance branches apart by their timestep);
:meth:`TeaCacheBackend.disable` removes them all, so the model computes exactly as before.

Nothing is reused across requests: :meth:`TeaCacheBackend.refresh` drops every stored
residual and input, so a different prompt, size or seed never meets a cached step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omni_core.cache import CACHE_QUALITIES, CacheBackend, CacheQuality, CacheTarget, StepReport
from omni_plugin_teacache.extractors import EXTRACTORS

#: the declaration keys a family must give, and what each is
DECLARATION_KEYS = {
    "extractor": f"the name of the modulated-input extractor ({', '.join(sorted(EXTRACTORS))})",
    "coefficients": "the rescaling polynomial's coefficients, highest degree first (numbers)",
    "blocks": "the dotted paths of the transformer's block lists, in the order they run",
    "block_outputs": "the names of what a block returns, in order (hidden_states, encoder_hidden_states)",
}
#: ``--cache-config`` keys
OPTION_KEYS = {
    "rel_l1_thresh": "the accumulated rescaled distance under which a step is skipped (a number > 0)",
    "coefficients": "the rescaling polynomial's coefficients, overriding the family's (numbers)",
}
#: the threshold when neither the options nor the family's declaration give one
DEFAULT_THRESHOLD = 0.2
#: the conservative profile of ``quality="high"``: a fraction of the threshold in force
HIGH_QUALITY_FACTOR = 0.5


@dataclass
class _Branch:
    """One guidance branch's TeaCache state (a pipeline with classifier-free guidance calls
    the transformer twice per step; each call sequence keeps its own)."""

    accumulated: float = 0.0
    previous_input: Any = None
    residual: Any = None


@dataclass
class _RequestState:
    steps: int = 0
    threshold: float = DEFAULT_THRESHOLD
    lossless: bool = False
    step: int = -1
    branch: int = 0
    last_timestep: Any = None
    branches: dict[int, _Branch] = field(default_factory=dict)
    #: this call's decision, read by every block of the stack
    skip: bool = False
    stack_input: Any = None
    computed: set[int] = field(default_factory=set)
    reused: set[int] = field(default_factory=set)


def _numbers(value: Any) -> list[float] | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return None
    return [float(v) for v in value]


class TeaCacheBackend(CacheBackend):
    """TeaCache on a diffusion transformer whose family declares its extractor and coefficients."""

    def __init__(self, target: CacheTarget, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(target, options)
        declaration = target.declaration
        self.extract: Callable[..., Any] = EXTRACTORS[str(declaration["extractor"])]
        coefficients = _numbers(self.options.get("coefficients")) or _numbers(declaration["coefficients"])
        assert coefficients is not None  # checked by option_problems / declaration_problems
        self.coefficients = coefficients
        self.threshold = float(self.options.get("rel_l1_thresh", declaration.get("rel_l1_thresh", DEFAULT_THRESHOLD)))
        self.block_paths = tuple(str(p) for p in declaration["blocks"])
        self.warmup_steps = max(1, int(declaration.get("warmup_steps", 1)))
        self.compute_last_step = bool(declaration.get("compute_last_step", True))
        self.outputs = tuple(str(o) for o in declaration["block_outputs"])
        self._state = _RequestState()
        self._originals: list[tuple[Any, Any]] = []  # (block, its own forward attribute or None)
        self._pre_hook: Any = None
        self._rescale: Any = None

    # ------------------------------------------------------------------ declared, checked early

    @classmethod
    def option_problems(cls, options: Mapping[str, Any]) -> list[str]:
        problems = []
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            known = "; ".join(f"{k}: {v}" for k, v in OPTION_KEYS.items())
            problems.append(f"unknown option(s) {', '.join(map(repr, unknown))} (teacache takes {known})")
        thresh = options.get("rel_l1_thresh")
        if thresh is not None and (isinstance(thresh, bool) or not isinstance(thresh, (int, float)) or thresh <= 0):
            problems.append(f"rel_l1_thresh must be a number above 0, not {thresh!r}")
        if "coefficients" in options and _numbers(options["coefficients"]) is None:
            problems.append("coefficients must be a non-empty list of numbers, highest degree first")
        return problems

    @classmethod
    def declaration_problems(cls, family: str, declaration: Mapping[str, Any]) -> list[str]:
        problems = [f"it lacks {key!r} ({what})" for key, what in DECLARATION_KEYS.items() if key not in declaration]
        if problems:
            return problems
        if declaration["extractor"] not in EXTRACTORS:
            problems.append(
                f"extractor {declaration['extractor']!r} is not one this plugin has ({', '.join(sorted(EXTRACTORS))})"
            )
        if _numbers(declaration["coefficients"]) is None:
            problems.append("coefficients must be a non-empty list of numbers")
        outputs = declaration["block_outputs"]
        if not isinstance(outputs, (list, tuple)) or "hidden_states" not in outputs:
            problems.append("block_outputs must name what a block returns, hidden_states among them")
        if not isinstance(declaration["blocks"], (list, tuple)) or not declaration["blocks"]:
            problems.append("blocks must list the dotted paths of the transformer's block lists")
        return problems

    # ------------------------------------------------------------------ lifecycle

    def _blocks(self) -> list[Any]:
        blocks: list[Any] = []
        for dotted in self.block_paths:
            node = self.target.transformer
            for part in dotted.split("."):
                node = getattr(node, part, None)
                if node is None:
                    raise ValueError(
                        f"the transformer ({type(self.target.transformer).__name__}) has no {dotted!r}, which the "
                        f"family {self.target.family!r} declares for teacache"
                    )
            blocks.extend(node)
        if not blocks:
            raise ValueError(f"the family {self.target.family!r} declares no transformer blocks for teacache")
        return blocks

    def enable(self) -> None:
        import numpy as np

        if self.is_enabled():
            return
        blocks = self._blocks()  # raises before anything is installed
        self._rescale = np.poly1d(self.coefficients)
        head, tail = blocks[0], blocks[-1]
        try:
            for block in blocks:
                own = block.__dict__.get("forward")  # an instance-level forward someone else set
                self._originals.append((block, own))
                block.forward = self._wrap(block, block.forward, head=block is head, tail=block is tail)
            self._pre_hook = self.target.transformer.register_forward_pre_hook(self._on_call, with_kwargs=True)
        except BaseException:
            self.disable()
            raise

    def disable(self) -> None:
        for block, own in reversed(self._originals):
            if own is None:
                block.__dict__.pop("forward", None)
            else:
                block.forward = own
        self._originals.clear()
        if self._pre_hook is not None:
            self._pre_hook.remove()
            self._pre_hook = None
        self._state = _RequestState(threshold=self.threshold)

    def is_enabled(self) -> bool:
        return bool(self._originals)

    def refresh(self, num_inference_steps: int, quality: CacheQuality | None = None) -> None:
        if quality is not None and quality not in CACHE_QUALITIES:
            raise ValueError(f"quality must be one of {', '.join(CACHE_QUALITIES)}, not {quality!r}")
        threshold = self.threshold * HIGH_QUALITY_FACTOR if quality == "high" else self.threshold
        self._state = _RequestState(steps=int(num_inference_steps), threshold=threshold, lossless=quality == "lossless")

    def report(self) -> StepReport:
        state = self._state
        reused = sorted(state.reused - state.computed)  # a step any branch computed counts as computed
        return StepReport(computed=sorted(state.computed), reused=reused)

    def describe(self) -> str:
        return f"rel_l1_thresh={self.threshold:g}, {len(self.coefficients)} coefficients ({self.target.family})"

    # ------------------------------------------------------------------ hooks

    def _on_call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before each transformer call: a new timestep is a new step; the same one again is the
        next guidance branch of the same step."""
        state = self._state
        timestep = kwargs.get("timestep")
        if timestep is None and len(args) > 2:
            timestep = args[2]
        same = (
            state.last_timestep is not None
            and timestep is not None
            and getattr(timestep, "shape", None) == getattr(state.last_timestep, "shape", None)
            and bool((timestep == state.last_timestep).all())
        )
        if same:
            state.branch += 1
        else:
            state.step += 1
            state.branch = 0
        state.last_timestep = timestep.detach().clone() if timestep is not None else None

    def _decide(self, modulated: Any) -> bool:
        """Whether this call skips the block stack (and the state that follows from it)."""
        state = self._state
        branch = state.branches.setdefault(state.branch, _Branch())
        last = self.compute_last_step and state.steps > 0 and state.step >= state.steps - 1
        warming = state.step < self.warmup_steps
        if state.lossless or branch.previous_input is None or branch.residual is None or warming or last:
            skip = False
        else:
            previous = branch.previous_input
            distance = ((modulated - previous).abs().mean() / (previous.abs().mean() + 1e-12)).item()
            branch.accumulated += float(self._rescale(distance))
            skip = branch.accumulated < state.threshold
        if not skip:
            branch.accumulated = 0.0
        branch.previous_input = modulated.detach().clone()
        return skip

    def _wrap(self, block: Any, forward: Callable[..., Any], head: bool, tail: bool) -> Callable[..., Any]:
        signature = inspect.signature(forward)
        outputs = self.outputs

        def bound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            arguments = signature.bind(*args, **kwargs)
            arguments.apply_defaults()
            return dict(arguments.arguments)

        def passthrough(values: dict[str, Any], hidden: Any) -> Any:
            if len(outputs) == 1:
                return hidden
            return tuple(hidden if name == "hidden_states" else values[name] for name in outputs)

        def hidden_of(result: Any) -> Any:
            return result if len(outputs) == 1 else result[outputs.index("hidden_states")]

        def run(*args: Any, **kwargs: Any) -> Any:
            state = self._state
            if head:
                values = bound(args, kwargs)
                state.skip = self._decide(self.extract(block, values))
                state.stack_input = values["hidden_states"]
                (state.reused if state.skip else state.computed).add(state.step)
            if state.skip:
                values = bound(args, kwargs)
                hidden = values["hidden_states"]
                if tail:
                    residual = state.branches[state.branch].residual
                    hidden = hidden + residual
                return passthrough(values, hidden)
            result = forward(*args, **kwargs)
            if tail:
                branch = state.branches[state.branch]
                branch.residual = (hidden_of(result) - state.stack_input).detach()
            return result

        return run
