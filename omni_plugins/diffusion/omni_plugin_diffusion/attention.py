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
    """Sends each attention call of the routed transformers to its role's backend.

    A call site is an attention module whose path matches one of the family's globs, or the
    routed transformer itself for a call made outside every attention module. A call from a
    site no glob matches is an error naming the site: it never borrows another role's
    backend. The router counts calls per (role, backend) and per routed transformer, so the
    report says what ran, and a transformer that ran without calling attention is caught."""

    def __init__(
        self,
        choices: dict[str, AttentionChoice],
        role_of: Callable[[str], tuple[str, str] | None],
        family: str = "this family",
    ) -> None:
        #: role -> choice, for every role the family declares
        self.choices = choices
        self._role_of = role_of
        self.family = family
        self._impls: dict[tuple[Any, ...], AttentionImpl] = {}
        self._handles: list[Any] = []
        #: (role, backend) -> number of attention calls served
        self.calls: Counter[tuple[str, str]] = Counter()
        #: routed transformer -> forward passes, and attention calls made inside them
        self.passes: Counter[str] = Counter()
        self.calls_in: Counter[str] = Counter()
        install()

    def _site_role(self, path: str) -> str | None:
        site = self._role_of(path)
        if site is None or site[0] not in self.choices:
            return None
        return site[0]

    def attach(self, component: str, module: Any) -> None:
        """Route the attention inside ``module`` (a transformer) while it runs."""
        for path, sub in module.named_modules():
            if path and is_attention_module(sub):
                site = f"{component}.{path}"
                self._handles.append(sub.register_forward_pre_hook(self._enter_site(self._site_role(site), site)))
                self._handles.append(sub.register_forward_hook(self._leave_site, always_call=True))
        outside = self._site_role(component)
        self._handles.append(module.register_forward_pre_hook(self._activate(component, outside)))
        self._handles.append(module.register_forward_hook(self._deactivate, always_call=True))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @staticmethod
    def _enter_site(role: str | None, site: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            _local.sites = [*getattr(_local, "sites", []), (role, site)]

        return hook

    @staticmethod
    def _leave_site(module: Any, args: Any, output: Any) -> None:
        sites = getattr(_local, "sites", [])
        _local.sites = sites[:-1]

    def _activate(self, component: str, role: str | None) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            _local.router, _local.component, _local.sites = self, component, [(role, component)]
            self.passes[component] += 1

        return hook

    def _deactivate(self, module: Any, args: Any, output: Any) -> None:
        _local.router, _local.sites = None, []

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
        from omni_core.errors import ModelRuntimeError

        if dropout_p:
            raise ValueError("attention dropout is a training feature; omni's attention backends run inference only")
        role, site = (getattr(_local, "sites", None) or [(None, "?")])[-1]
        if role is None:
            raise ModelRuntimeError(
                f"{self.family}: an attention call at {site} matches none of the family's attention_roles "
                f"(declared roles: {', '.join(self.choices)}), so omni cannot tell which backend it should use. "
                "This is a gap in the family plugin: add a glob for that site to its attention_roles"
            )
        choice = self.choices[role]
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
        self.calls_in[getattr(_local, "component", "?")] += 1
        return out.transpose(1, 2)

    def reset(self) -> None:
        """Forget the counts (the engine calls it before each generation)."""
        self.calls.clear()
        self.passes.clear()
        self.calls_in.clear()

    def ran(self) -> dict[str, str]:
        """role -> backend that actually served calls since the last :meth:`reset`; a role that
        made no call is absent (never filled in from the configuration)."""
        out: dict[str, set[str]] = {}
        for (role, backend), n in self.calls.items():
            if n:
                out.setdefault(role, set()).add(backend)
        return {role: "+".join(sorted(b)) for role, b in out.items()}

    def silent(self) -> list[str]:
        """Routed transformers that ran a forward pass without making one attention call: their
        attention went somewhere omni does not route, so no chosen backend ran for them."""
        return [component for component, n in self.passes.items() if n and not self.calls_in[component]]
