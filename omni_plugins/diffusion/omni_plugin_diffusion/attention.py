"""Routing a diffusers transformer's attention through omni's selected backends.

diffusers' attention processors end in ``torch.nn.functional.scaled_dot_product_attention``
(directly, or through its native dispatch backend). :func:`install` wraps that function once
per process; the wrapper forwards to omni only while an :class:`AttentionRouter` is active
on the current thread, which it is exactly while a routed transformer runs its forward.
Everything else (text encoders, other threads, other libraries) calls torch as before.

Inside a transformer, forward pre-hooks on each attention module set the current call site,
so every call gets the role its family declares (``DiffusersFamily.attention_roles``) and the
backend chosen for that role. The router counts calls per (role, backend): tests and
``explain`` read what actually ran, not what was configured.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from omni_core.attention import AttentionImpl, AttentionMetadata
from omni_core.attention.selector import AttentionChoice

_local = threading.local()
_original: Callable[..., Any] | None = None
_install_lock = threading.Lock()


def _routed_sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    router: AttentionRouter | None = getattr(_local, "router", None)
    assert _original is not None
    if router is None:
        return _original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return router.attend(query, key, value, attn_mask, dropout_p, is_causal, scale)


def install() -> None:
    """Wrap torch's SDPA once per process (idempotent; inactive until a router is entered)."""
    global _original
    import torch.nn.functional as F

    with _install_lock:
        if _original is None:
            _original = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _routed_sdpa


def is_attention_module(module: Any) -> bool:
    """diffusers attention modules: the classic ``Attention`` and the newer per-model classes."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    return isinstance(module, (Attention, AttentionModuleMixin))


class AttentionRouter:
    """Sends each attention call of the routed transformers to its role's backend."""

    def __init__(self, choices: dict[str, AttentionChoice], role_of: Callable[[str], tuple[str, str]]) -> None:
        #: role -> choice, for every role the family declares
        self.choices = choices
        self._role_of = role_of
        self._impls: dict[tuple[Any, ...], AttentionImpl] = {}
        self._handles: list[Any] = []
        #: (role, backend) -> number of attention calls served
        self.calls: Counter[tuple[str, str]] = Counter()
        install()

    def attach(self, component: str, module: Any) -> None:
        """Route the attention inside ``module`` (a transformer) while it runs."""
        for path, sub in module.named_modules():
            if path and is_attention_module(sub):
                role = self._role_of(f"{component}.{path}")[0]
                if role not in self.choices:
                    raise KeyError(f"attention role {role!r} at {component}.{path} has no backend choice")
                self._handles.append(sub.register_forward_pre_hook(self._enter_site(role)))
        self._handles.append(module.register_forward_pre_hook(self._activate))
        self._handles.append(module.register_forward_hook(self._deactivate, always_call=True))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @staticmethod
    def _enter_site(role: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            _local.role = role

        return hook

    def _activate(self, module: Any, args: Any) -> None:
        _local.router, _local.role = self, "self"

    def _deactivate(self, module: Any, args: Any, output: Any) -> None:
        _local.router = None

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Calls torch's own SDPA inside (a backend built on it must not recurse into the router)."""
        previous = getattr(_local, "router", None)
        _local.router = None
        try:
            yield
        finally:
            _local.router = previous

    def attend(
        self, query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float, is_causal: bool, scale: float | None
    ) -> Any:
        if dropout_p:
            raise ValueError("attention dropout is a training feature; omni's attention backends run inference only")
        role = getattr(_local, "role", "self")
        choice = self.choices.get(role) or self.choices["self"]
        _, heads, _, head_dim = query.shape
        kv_heads = key.shape[1]
        impl_key = (choice.role, heads, kv_heads, head_dim, scale, is_causal)
        impl = self._impls.get(impl_key)
        if impl is None:
            impl = self._impls[impl_key] = choice.create(heads, head_dim, scale, is_causal, kv_heads)
        metadata = AttentionMetadata(attn_mask=attn_mask) if attn_mask is not None else None
        if attn_mask is not None and not choice.backend_class.supports_mask:
            raise ValueError(
                f"{choice.backend} does not take attention masks, but role {role!r} passes one; "
                "choose a backend that does (e.g. TORCH_SDPA) for this role"
            )
        with self.suspended():
            out = impl.forward(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), metadata)
        self.calls[(role, choice.backend)] += 1
        return out.transpose(1, 2)

    def backends(self) -> dict[str, str]:
        """role -> backend that is configured for it."""
        return {role: choice.backend for role, choice in self.choices.items()}

    def ran(self) -> dict[str, str]:
        """role -> backend(s) that actually served calls since the counters were last reset."""
        out: dict[str, set[str]] = {}
        for (role, backend), n in self.calls.items():
            if n:
                out.setdefault(role, set()).add(backend)
        return {role: "+".join(sorted(b)) for role, b in out.items()}
