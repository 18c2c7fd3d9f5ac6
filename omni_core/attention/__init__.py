"""The attention call contract every backend implements.

Layout: ``query``, ``key``, ``value`` and the output are ``(batch, seq, heads, head_dim)``.
``key``/``value`` may have fewer heads than ``query`` (GQA/MQA) when the backend declares
``supports_gqa``; ``num_heads`` must be a multiple of ``num_kv_heads``. ``softmax_scale``
defaults to ``head_dim ** -0.5``. ``causal`` masks future keys (aligned to the end when
q and k lengths differ). ``metadata.attn_mask`` is a boolean mask (True = attend) or an
additive float mask, broadcastable to ``(batch, heads, seq_q, seq_k)``. Variable-length
batches pass ``cu_seqlens_q``/``cu_seqlens_k`` in ``metadata.extra``.

An implementation is built once per layer from ``(num_heads, head_size, softmax_scale,
causal, num_kv_heads, prefix)``; ``prefix`` is the layer's role name (``"self"``,
``"cross"``, ``"ltx2.audio_to_video"``) used for per-role selection.
"""

from __future__ import annotations

import abc
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from omni_core.identity import DeclaredIdentity  # name etc. come from the registration
from omni_core.kinds import Kind

if TYPE_CHECKING:
    from omni_core.platforms import Platform


@dataclass
class AttentionMetadata:
    attn_mask: Any = None
    #: backend-specific extras: ``cu_seqlens_q/k``, ``max_seqlen_q/k``, ...
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str


class AttentionImpl(abc.ABC):
    """One layer's attention, built by :meth:`AttentionBackend.create`."""

    #: the role's :class:`omni_core.attention.config.AttentionSpec` when the backend was chosen
    #: explicitly with option blocks (validated and set by ``create``); None otherwise
    options: Any = None

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        softmax_scale: float | None = None,
        causal: bool = False,
        num_kv_heads: int | None = None,
        prefix: str = "",
    ) -> None:
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads <= 0 or head_size <= 0 or num_kv_heads <= 0:
            raise ValueError("num_heads, head_size and num_kv_heads must be positive")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.softmax_scale = head_size**-0.5 if softmax_scale is None else softmax_scale
        self.causal = causal
        self.prefix = prefix

    @abc.abstractmethod
    def forward(self, query: Any, key: Any, value: Any, metadata: AttentionMetadata | None = None) -> Any:
        """Attention over ``(batch, seq, heads, head_dim)`` tensors; returns the query's shape."""


class AttentionBackend(DeclaredIdentity, abc.ABC, identity_of=Kind.ATTENTION_BACKEND):
    """A named attention kernel and what it supports. Registered through
    ``omni_register_attention_backends``; never instantiated, only asked and ``create``-d."""

    name: ClassVar[str]
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    #: head sizes it accepts; empty means any
    supported_head_sizes: ClassVar[tuple[int, ...]] = ()
    supports_mask: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = False
    supports_varlen: ClassVar[bool] = False
    #: device types it runs on; empty means any
    device_types: ClassVar[tuple[str, ...]] = ()
    #: import names of the packages it needs (checked with find_spec, not imported)
    required_packages: ClassVar[tuple[str, ...]] = ()
    #: lossy backends (quantised kernels) are never chosen automatically
    lossy: ClassVar[bool] = False
    #: compute capability bounds (inclusive) where the idea applies, e.g. ``(8, 0)`` for Ampere+
    min_compute_capability: ClassVar[tuple[int, int] | None] = None
    max_compute_capability: ClassVar[tuple[int, int] | None] = None
    #: option blocks of :class:`omni_core.attention.config.AttentionSpec` it understands
    supported_options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def availability(cls, platform: Platform) -> Availability:
        """Whether it can run on ``platform`` here, and if not, why (without importing kernels)."""
        if cls.device_types and platform.device_type not in cls.device_types:
            return Availability(False, f"runs on {'/'.join(cls.device_types)}, not {platform.device_type}")
        missing = [p for p in cls.required_packages if importlib.util.find_spec(p) is None]
        if missing:
            return Availability(False, f"package(s) not installed: {', '.join(missing)}")
        if cls.min_compute_capability or cls.max_compute_capability:
            cc = platform.compute_capability()
            low, high = cls.min_compute_capability, cls.max_compute_capability
            if cc is None:
                return Availability(False, f"needs a compute capability, {platform.name} reports none")
            if low and cc < low:
                return Availability(False, f"needs compute capability >= {_cc(low)}, have {_cc(cc)}")
            if high and cc > high:
                return Availability(False, f"needs compute capability <= {_cc(high)}, have {_cc(cc)}")
        return Availability(True, "available")

    @classmethod
    def unsupported_reason(
        cls,
        *,
        head_size: int | None = None,
        dtype: str | None = None,
        causal: bool = False,
        mask: bool = False,
        varlen: bool = False,
        gqa: bool = False,
    ) -> str | None:
        """Why this backend cannot serve a call with these properties, or None if it can."""
        if head_size is not None and cls.supported_head_sizes and head_size not in cls.supported_head_sizes:
            return f"head size {head_size} not in {list(cls.supported_head_sizes)}"
        if dtype is not None and dtype not in cls.supported_dtypes:
            return f"dtype {dtype} not in {list(cls.supported_dtypes)}"
        for needed, supported, what in (
            (causal, cls.supports_causal, "causal attention"),
            (mask, cls.supports_mask, "attention masks"),
            (varlen, cls.supports_varlen, "variable-length batches"),
            (gqa, cls.supports_gqa, "grouped-query attention"),
        ):
            if needed and not supported:
                return f"does not support {what}"
        return None

    @classmethod
    def validate_options(cls, spec: Any) -> None:
        """Reject option blocks this backend does not understand, then check their values.

        ``spec`` is an :class:`omni_core.attention.config.AttentionSpec`. Raises ``ValueError``
        naming the block and what the backend accepts; never ignores an option silently."""
        given = spec.option_blocks()
        unknown = sorted(given - cls.supported_options)
        if unknown:
            accepts = ", ".join(sorted(cls.supported_options)) or "no option blocks"
            raise ValueError(f"{cls.name} does not support option block(s) {unknown}; it accepts {accepts}")
        cls.check_option_values(spec)

    @classmethod
    def check_option_values(cls, spec: Any) -> None:
        """Value-level checks of the blocks a backend supports (override where rules exist)."""
        return None

    @classmethod
    @abc.abstractmethod
    def impl_class(cls) -> type[AttentionImpl]:
        """The per-layer implementation class (imported here, so heavy imports stay lazy)."""

    @classmethod
    def create(
        cls,
        num_heads: int,
        head_size: int,
        softmax_scale: float | None = None,
        causal: bool = False,
        num_kv_heads: int | None = None,
        prefix: str = "",
        options: Any = None,
    ) -> AttentionImpl:
        """Build one layer's implementation. ``options`` is the governing ``AttentionSpec``
        when it carries option blocks: it is validated here and handed to the impl as
        ``impl.options``, so the blocks a backend accepts actually reach its kernel."""
        if cls.supported_head_sizes and head_size not in cls.supported_head_sizes:
            raise ValueError(f"{cls.name} supports head sizes {list(cls.supported_head_sizes)}, not {head_size}")
        if causal and not cls.supports_causal:
            raise ValueError(f"{cls.name} does not support causal attention")
        if num_kv_heads not in (None, num_heads) and not cls.supports_gqa:
            raise ValueError(f"{cls.name} does not support grouped-query attention")
        if options is not None:
            cls.validate_options(options)
        impl = cls.impl_class()(num_heads, head_size, softmax_scale, causal, num_kv_heads, prefix)
        if options is not None:
            impl.options = options
        return impl


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def contract_problems(backend: Any) -> list[str]:
    """Ways ``backend`` breaks the contract; empty when it holds. Used by the conformance kit,
    since backends are asked, not instantiated, so a missing method would go unnoticed."""
    if not (isinstance(backend, type) and issubclass(backend, AttentionBackend)):
        return [f"{backend!r} is not a subclass of omni_core.attention.AttentionBackend"]
    problems = []
    if not isinstance(getattr(backend, "name", None), str):
        problems.append("class attribute 'name' must be a string")
    if getattr(backend, "__abstractmethods__", None):
        problems.append(f"abstract methods not implemented: {sorted(backend.__abstractmethods__)}")
    else:
        impl = backend.impl_class()
        if not (isinstance(impl, type) and issubclass(impl, AttentionImpl)):
            problems.append("impl_class() must return an AttentionImpl subclass")
        elif getattr(impl, "__abstractmethods__", None):
            problems.append(f"{impl.__name__} leaves {sorted(impl.__abstractmethods__)} unimplemented")
    for attr in ("supported_dtypes", "supported_head_sizes", "device_types", "required_packages"):
        if not isinstance(getattr(backend, attr, None), tuple):
            problems.append(f"class attribute {attr!r} must be a tuple")
    return problems
