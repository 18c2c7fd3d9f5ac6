"""Choosing an attention backend per role, explainably.

Explicit choices (a role's spec, the default spec, or the global shorthand) either run or
fail at startup with the reason; they are never swapped for another backend. Automatic
choices walk the platform's default chain and take the first backend that is installed,
available here and supports the call, recording why each earlier one was passed over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_core.attention import AttentionBackend, AttentionImpl, contract_problems
from omni_core.attention.config import AttentionConfig, AttentionConfigError, AttentionSpec
from omni_core.errors import OmniError
from omni_core.selection import Explanation, Outcome

if TYPE_CHECKING:
    from omni_core.platforms import Platform
    from omni_core.plugins import PluginSet

LAST_RESORT = "TORCH_SDPA"


@dataclass(frozen=True)
class CallProfile:
    """What the model's call site needs; backends that cannot serve it are passed over."""

    head_size: int | None = None
    dtype: str | None = None
    causal: bool = False
    mask: bool = False
    varlen: bool = False
    gqa: bool = False
    #: the model opts into kernels that need packed, mask-free calls
    packed_mask_free: bool = False


@dataclass
class AttentionChoice:
    role: str
    backend: str
    backend_class: type[AttentionBackend]
    #: the spec when chosen explicitly; None when chosen automatically
    spec: AttentionSpec | None
    explanation: Explanation

    @property
    def explicit(self) -> bool:
        return self.spec is not None

    def create(
        self,
        num_heads: int,
        head_size: int,
        softmax_scale: float | None = None,
        causal: bool = False,
        num_kv_heads: int | None = None,
    ) -> AttentionImpl:
        if self.spec is not None and self.spec.option_blocks():
            # the option blocks reach the implementation (``impl.options``); a spec without
            # blocks is not passed, so backends whose ``create`` predates options keep working
            return self.backend_class.create(
                num_heads, head_size, softmax_scale, causal, num_kv_heads, prefix=self.role, options=self.spec
            )
        return self.backend_class.create(num_heads, head_size, softmax_scale, causal, num_kv_heads, prefix=self.role)


def _candidate(
    plugins: PluginSet, platform: Platform, name: str, call: CallProfile, automatic: bool
) -> tuple[str, type[AttentionBackend] | None, str, str]:
    """(registry name, class or None, reason, provider) for one backend name."""
    actual = platform.resolve_attention_name(name)
    via = f"{platform.name} serves {name} with {actual}; " if actual != name.upper() else ""
    registry = plugins.attention_backends
    if actual not in registry:
        return actual, None, via + registry.why_missing(actual), ""
    entry = registry.get(actual)
    provider = str(entry.provider)
    try:
        cls = entry.load()
    except OmniError as exc:
        return actual, None, via + str(exc), provider
    problems = contract_problems(cls)
    if problems:
        return actual, None, via + "breaks the backend contract: " + "; ".join(problems), provider
    try:
        available = cls.availability(platform)
        unsupported = cls.unsupported_reason(
            head_size=call.head_size,
            dtype=call.dtype,
            causal=call.causal,
            mask=call.mask,
            varlen=call.varlen,
            gqa=call.gqa,
        )
    except Exception as exc:  # a backend's own check failing is a reason, not a crash
        return actual, None, via + f"its availability check raised {type(exc).__name__}: {exc}", provider
    if not available.ok:
        return actual, None, via + available.reason, provider
    if unsupported:
        return actual, None, via + unsupported, provider
    if automatic and cls.lossy:
        return actual, None, via + "lossy: used only when chosen explicitly", provider
    return actual, cls, via + "available and supports the call", provider


def _explicit_only_reason(plugins: PluginSet, platform: Platform, name: str, call: CallProfile) -> str:
    """Why a registered backend outside the chain was not chosen, and whether naming it would work."""
    if platform.resolve_attention_name(name) != name.upper():
        return f"unreachable on {platform.name}: the name {name} means {platform.resolve_attention_name(name)} here"
    _, cls, reason, _ = _candidate(plugins, platform, name, call, automatic=False)
    head = f"not in {platform.name}'s default chain: explicit only"
    return head if cls is not None else f"{head}, and cannot run here: {reason}"


def _default_chain(platform: Platform, call: CallProfile) -> list[str]:
    """The platform's default chain for this call, always ending in :data:`LAST_RESORT`."""
    # packed_mask_free joined the signature within plugin API 1.0: pass it only when a model
    # opts in, so platforms that override the original default_attention_chain(head_size) work
    if call.packed_mask_free:
        chain = list(platform.default_attention_chain(call.head_size, packed_mask_free=True))
    else:
        chain = list(platform.default_attention_chain(call.head_size))
    if not chain or chain[-1] != LAST_RESORT:
        chain.append(LAST_RESORT)
    return chain


def explain_attention(
    plugins: PluginSet,
    platform: Platform,
    config: AttentionConfig | None = None,
    role: str = "self",
    category: str | None = None,
    call: CallProfile = CallProfile(),
) -> tuple[AttentionChoice | None, Explanation]:
    """Choose the backend for one role and say why; ``(None, explanation)`` if nothing can run.
    Raises :class:`AttentionConfigError` for an explicit choice that cannot run or whose
    options the backend rejects.

    One walk serves both cases: an explicit choice is a chain of one name that may not be
    passed over (and may be lossy); an automatic one is the platform's default chain."""
    config = config or AttentionConfig()
    spec, source = config.spec_for(role, category)
    explanation = Explanation(f"attention for role {role!r} on {platform.name}")
    explicit = spec.backend is not None
    if not explicit and spec.option_blocks():
        raise AttentionConfigError(
            f"role {role!r} ({source}) sets option block(s) {sorted(spec.option_blocks())} without a backend; "
            "options belong to a backend, so name one with them"
        )
    requested = [spec.backend] if spec.backend is not None else _default_chain(platform, call)
    chosen: tuple[str, type[AttentionBackend]] | None = None
    seen: set[str] = set()
    last_reason = ""
    for name in requested:
        actual, cls, reason, provider = _candidate(plugins, platform, name, call, automatic=not explicit)
        if actual in seen:
            continue
        seen.add(actual)
        if chosen is not None:
            explanation.add(actual, Outcome.NOT_CONSIDERED, "an earlier backend in the chain was chosen", provider)
        elif cls is None:
            explanation.add(actual, Outcome.REJECTED, reason, provider)
            last_reason = reason
        else:
            if explicit:
                try:
                    cls.validate_options(spec)
                except ValueError as exc:
                    raise AttentionConfigError(f"role {role!r} ({source}): {exc}") from None
                reason = f"explicit ({source}); {reason}"
            explanation.add(actual, Outcome.SELECTED, reason, provider)
            chosen = actual, cls
    for other in plugins.attention_backends.names():
        if other.upper() not in seen:
            why = "an explicit choice decides" if explicit else _explicit_only_reason(plugins, platform, other, call)
            explanation.add(other, Outcome.NOT_CONSIDERED, why)
    if chosen is None:
        if explicit:
            raise AttentionConfigError(
                f"attention backend {spec.backend} was chosen explicitly for role {role!r} ({source}) but cannot "
                f"run here: {last_reason}. Choose another backend (`omni explain attention` lists them) or remove "
                "the choice to let omni pick."
            )
        explanation.rule = "no backend in the default chain can run here"
        return None, explanation
    name, cls = chosen
    explanation.winner = name
    if explicit:
        explanation.rule = f"explicit choice in {source}"
    else:
        rejected = [c for c in explanation.candidates if c.outcome is Outcome.REJECTED]
        explanation.rule = f"defaulting to {name}" + (
            f" ({rejected[-1].name} and earlier were passed over)" if rejected else " (first in the default chain)"
        )
    return AttentionChoice(role, name, cls, spec if explicit else None, explanation), explanation


def select_attention(
    plugins: PluginSet,
    platform: Platform,
    config: AttentionConfig | None = None,
    role: str = "self",
    category: str | None = None,
    call: CallProfile = CallProfile(),
) -> AttentionChoice:
    """Like :func:`explain_attention`, but raises when nothing can be chosen."""
    choice, explanation = explain_attention(plugins, platform, config, role, category, call)
    if choice is None:
        raise AttentionConfigError(f"no attention backend can run role {role!r}:\n{explanation.render()}")
    return choice


def describe_backends(plugins: PluginSet, platform: Platform) -> list[dict[str, Any]]:
    """Every registered backend with what it declares and whether it runs here."""
    rows = []
    for entry in plugins.attention_backends:
        row: dict[str, Any] = {"name": entry.name, "provider": str(entry.provider)}
        try:
            cls = entry.load()
            availability = cls.availability(platform)
            row.update(
                available=availability.ok,
                reason=availability.reason,
                dtypes=list(cls.supported_dtypes),
                head_sizes=list(cls.supported_head_sizes),
                mask=cls.supports_mask,
                causal=cls.supports_causal,
                gqa=cls.supports_gqa,
                varlen=cls.supports_varlen,
                lossy=cls.lossy,
                options=sorted(cls.supported_options),
            )
        except Exception as exc:
            row.update(available=False, reason=f"{type(exc).__name__}: {exc}")
        rows.append(row)
    return rows
