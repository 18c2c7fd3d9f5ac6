"""The platform interface: one class of answers about the hardware.

Nothing outside a platform plugin asks ``torch.cuda`` (or any vendor module) anything; it asks
:func:`current_platform`. This module imports no torch: plugins import the base class freely,
and detection runs only on first access.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

# OMNI_PROBE_TIMEOUT is read in omni_core.config, the one module that reads the environment
from omni_core.config import DEFAULT_PROBE_TIMEOUT_S as DEFAULT_PROBE_TIMEOUT_S
from omni_core.config import probe_timeout as probe_timeout
from omni_core.errors import OmniError, PlatformSelectionError, ProbeTimeoutError
from omni_core.identity import DeclaredIdentity  # name etc. come from the registration
from omni_core.kinds import Kind
from omni_core.selection import Explanation, Outcome

if TYPE_CHECKING:
    from omni_core.plugins import PluginSet
    from omni_core.registry import PlatformSpec, Registered


@dataclass(frozen=True)
class ProbeResult:
    """A probe's answer: does this platform's hardware exist here, and how it knows."""

    claims: bool
    reason: str


@dataclass(frozen=True)
class MemoryInfo:
    free_bytes: int
    total_bytes: int


class Platform(DeclaredIdentity, abc.ABC, identity_of=Kind.PLATFORM):
    """Everything hardware-specific the rest of omni needs. Subclass it in a platform plugin.

    Methods that need the device (and so torch or a vendor SDK) import it inside the method:
    constructing a platform object is cheap and touches no driver.
    """

    #: registry name, e.g. ``"cuda"``
    name: ClassVar[str]
    #: torch device type, e.g. ``"cuda"``, ``"cpu"``, ``"npu"``, ``"xpu"``
    device_type: ClassVar[str]
    #: environment variable that restricts visible devices, if the vendor has one
    visible_devices_env: ClassVar[str | None] = None
    #: whether offload strategies can run here (weights parked in host memory and moved in on
    #: use); ``omni_core.offload.choose_offloader`` refuses offload on a platform that says False
    supports_offload: ClassVar[bool] = False
    #: device<->host copies must be blocking (an allocator that cannot evict during async copies)
    blocking_offload_copies: ClassVar[bool] = False

    @abc.abstractmethod
    def device_count(self) -> int:
        """Number of devices of this type visible to the process."""

    def device(self, local_rank: int = 0) -> Any:
        """The ``torch.device`` a worker of this local rank computes on."""
        import torch

        return torch.device(self.device_type, local_rank)

    @abc.abstractmethod
    def device_name(self, index: int = 0) -> str:
        """Human-readable model of the device, e.g. ``NVIDIA H200``."""

    @abc.abstractmethod
    def memory_info(self, index: int = 0) -> MemoryInfo:
        """Free and total memory of one device, in bytes."""

    @abc.abstractmethod
    def supported_dtypes(self) -> tuple[str, ...]:
        """Floating dtypes the device computes in, by torch name (``"bfloat16"``, ...)."""

    def compute_capability(self, index: int = 0) -> tuple[int, int] | None:
        """Vendor compute capability (CUDA ``(9, 0)``), or None where the idea does not apply."""
        return None

    #: shared attention names this platform serves with its own kernel, e.g. ROCm maps
    #: ``{"FLASH_ATTN": "ROCM_AITER_FA"}``: asking for FLASH_ATTN there runs AITER
    attention_aliases: ClassVar[dict[str, str]] = {}

    def default_attention_chain(self, head_size: int | None = None, packed_mask_free: bool = False) -> tuple[str, ...]:
        """Attention backend names to try, in order, when none is chosen explicitly.

        ``packed_mask_free`` is the model's opt-in for kernels that need packed, mask-free
        calls. The chain must end with ``TORCH_SDPA``, the universal last resort."""
        return ("TORCH_SDPA",)

    def resolve_attention_name(self, name: str) -> str:
        """The registry name that serves ``name`` on this platform (vendor kernels behind a
        shared name); names are case-insensitive."""
        key = name.strip().upper()
        return self.attention_aliases.get(key, key)

    def autocast(self, dtype: str) -> contextlib.AbstractContextManager[Any]:
        """A context in which matmuls run in ``dtype`` on this device."""
        import torch

        return torch.autocast(device_type=self.device_type, dtype=getattr(torch, dtype))

    def seed_everything(self, seed: int) -> None:
        """Seed every random generator that affects computation on this platform: Python's,
        and numpy's and torch's where they are imported. A model that computes with torch has
        imported it by the time it is seeded (it is loaded first); a torch-free one (an ONNX
        voice) is not made to import torch, which would cost seconds and change nothing."""
        import random
        import sys

        random.seed(seed)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(seed % 2**32)
        if "torch" in sys.modules:
            sys.modules["torch"].manual_seed(seed)

    def synchronize(self) -> None:
        """Wait for queued device work to finish (a no-op where work is synchronous)."""

    def facts(self) -> dict[str, Any]:
        """What ``omni doctor`` prints about the hardware. Override to add driver facts."""
        count = self.device_count()
        facts: dict[str, Any] = {"platform": self.name, "device_type": self.device_type, "device_count": count}
        if count:
            mem = self.memory_info(0)
            facts.update(
                device_name=self.device_name(0),
                memory_total_gib=round(mem.total_bytes / 2**30, 1),
                memory_free_gib=round(mem.free_bytes / 2**30, 1),
                compute_capability=self.compute_capability(0),
            )
        facts["supported_dtypes"] = list(self.supported_dtypes())
        facts["default_attention_chain"] = list(self.default_attention_chain())
        facts["supports_offload"] = self.supports_offload
        return facts


@dataclass
class PlatformChoice:
    entry: Registered[PlatformSpec]
    explanation: Explanation

    @property
    def name(self) -> str:
        return self.entry.name

    def instantiate(self) -> Platform:
        cls = self.entry.load()
        if not (isinstance(cls, type) and issubclass(cls, Platform)):
            raise PlatformSelectionError(
                f"platform {self.name!r} from {self.entry.provider} refers to {self.entry.spec.ref!r}, "
                "which is not a subclass of omni_core.platforms.Platform"
            )
        return cls()




# defined in omni_core.errors (one error hierarchy); the old name keeps working
ProbeTimeout = ProbeTimeoutError


def run_probe(entry: Registered[PlatformSpec], timeout: float, cache_dir: Any = None) -> ProbeResult:
    """Call one platform's probe under a time bound.

    The probe runs in a daemon thread: one that hangs (a driver call that never returns) is
    abandoned after ``timeout`` seconds and recorded as failed, and cannot keep the process
    alive at exit. Its ``SystemExit`` and ``KeyboardInterrupt`` are contained like any plugin
    code's (a thread never receives the user's Ctrl-C; that arrives in the waiting main thread).
    """
    from omni_core import breadcrumb
    from omni_core.guard import contained
    from omni_core.lazy import LazyRef

    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            with contained():
                probe = LazyRef(entry.spec.probe, owner=entry.provider.plugin).resolve()
                outcome.append((True, probe()))
        except BaseException as exc:  # contained() left only real exceptions; keep any for the caller
            outcome.append((False, exc))

    if cache_dir is not None:
        p = entry.provider
        breadcrumb.mark(cache_dir, p.plugin, p.distribution, p.version, f"probe of platform {entry.name!r}")
    worker = threading.Thread(target=run, name=f"omni-probe-{entry.name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive() or not outcome:
        raise ProbeTimeout(f"probe took longer than {timeout:g} s (OMNI_PROBE_TIMEOUT) and was abandoned")
    ok, result = outcome[0]
    if not ok:
        raise result
    if result is None:
        return ProbeResult(False, "probe answered None (no hardware)")
    if isinstance(result, bool):
        return ProbeResult(result, "probe answered " + ("yes" if result else "no"))
    if not isinstance(result, ProbeResult):
        raise TypeError(f"probe returned {type(result).__name__}, expected ProbeResult or bool")
    return result


def _describe_failure(exc: BaseException) -> str:
    from omni_core.guard import describe

    return str(exc) if isinstance(exc, ProbeTimeout) else f"probe raised {describe(exc)}"


def explain_platform(plugins: PluginSet) -> tuple[PlatformChoice | None, Explanation]:
    """Choose the platform and say why. Returns ``(None, explanation)`` when none can be chosen."""
    from omni_core import breadcrumb

    timeout = probe_timeout()
    cache_dir = plugins.settings.cache_dir
    try:
        return _explain_platform(plugins, timeout, cache_dir)
    finally:
        breadcrumb.clear(cache_dir)


def _explain_platform(plugins: PluginSet, timeout: float, cache_dir: Any) -> tuple[PlatformChoice | None, Explanation]:
    registry = plugins.platforms
    forced = plugins.settings.platform
    explanation = Explanation("platform")
    entries = list(registry)
    ignored_force = ""
    if forced and plugins.settings.safe_mode and forced not in registry:
        # safe mode must reach a working machine: a forced platform that only a (now disabled)
        # third-party plugin provides is set aside rather than leaving no platform at all
        ignored_force = f"; OMNI_PLATFORM={forced} ignored in safe mode (no built-in plugin provides it)"
        forced = None
    if forced:
        if forced not in registry:
            for e in entries:
                explanation.add(e.name, Outcome.REJECTED, f"OMNI_PLATFORM={forced} forces another", str(e.provider))
            known = ", ".join(registry.names()) or "none"
            explanation.rule = f"OMNI_PLATFORM={forced} names no installed platform (installed: {known})"
            return None, explanation
        winner = registry.get(forced)
        # Forcing skips the choice, not the check: a platform whose hardware is absent would
        # only fail later with an unrelated error (a dtype the CPU lacks, a missing driver).
        try:
            result: ProbeResult | None = run_probe(winner, timeout, cache_dir)
            forced_note = "forced"
        except Exception as exc:  # a broken probe is no proof of absence: forcing goes ahead
            result, forced_note = None, f"forced; its probe failed ({_describe_failure(exc)})"
        for e in entries:
            if e is winner:
                outcome = Outcome.SELECTED if result is None or result.claims else Outcome.REJECTED
                reason = forced_note if result is None or result.claims else f"forced, but {result.reason}"
                explanation.add(e.name, outcome, reason, str(e.provider))
            else:
                explanation.add(e.name, Outcome.NOT_CONSIDERED, f"OMNI_PLATFORM={forced}", str(e.provider))
        if result is not None and not result.claims:
            explanation.rule = (
                f"OMNI_PLATFORM={forced} (or the config file's platform) forces platform {winner.name!r}, but its "
                f"probe says the hardware is absent: {result.reason}. Unset OMNI_PLATFORM (or remove platform "
                f"from {plugins.settings.config_path}) to let omni choose, or fix the driver or the vendor "
                "build of torch the probe looks for"
            )
            return None, explanation
        explanation.winner, explanation.rule = winner.name, f"forced by OMNI_PLATFORM or config platform={forced}"
        return PlatformChoice(winner, explanation), explanation

    claims: list[Registered[PlatformSpec]] = []
    for e in entries:
        try:
            result = run_probe(e, timeout, cache_dir)
        except Exception as exc:
            explanation.add(e.name, Outcome.FAILED, _describe_failure(exc), str(e.provider))
            continue
        if result.claims:
            claims.append(e)
            explanation.add(
                e.name, Outcome.REJECTED, f"claims: {result.reason} (priority {e.spec.priority})", str(e.provider)
            )
        else:
            explanation.add(e.name, Outcome.REJECTED, f"does not claim: {result.reason}", str(e.provider))
    if not claims:
        disabled = _disabled_platform_plugins(plugins)
        if disabled:  # the likely cause, with the way back
            explanation.rule = (
                f"no platform claims this machine; installed but disabled: {', '.join(disabled)} "
                "(`omni plugins enable NAME`, or `omni --safe-mode` to run on the built-in plugins)"
            )
        else:
            explanation.rule = "no platform claims this machine; install omni-plugin-cpu or a vendor plugin"
        explanation.rule += ignored_force
        return None, explanation
    claims.sort(key=lambda e: -e.spec.priority)
    top = [e for e in claims if e.spec.priority == claims[0].spec.priority]
    if len(top) > 1:
        names = " and ".join(f"{e.name} ({e.provider})" for e in top)
        explanation.rule = (
            f"only one platform can be active, but {names} claim this machine at priority "
            f"{top[0].spec.priority}; choose with OMNI_PLATFORM=NAME"
        )
        return None, explanation
    winner = claims[0]
    for c in explanation.candidates:
        if c.name == winner.name:
            c.outcome = Outcome.SELECTED
    rule = "only claimant" if len(claims) == 1 else f"highest priority ({winner.spec.priority}) among claimants"
    explanation.winner, explanation.rule = winner.name, rule + ignored_force
    return PlatformChoice(winner, explanation), explanation


def _disabled_platform_plugins(plugins: PluginSet) -> list[str]:
    from omni_core.kinds import Kind

    return [
        r.name
        for r in plugins.records
        if r.status.value == "disabled" and r.manifest is not None and r.manifest.of_kind(Kind.PLATFORM)
    ]


def select_platform(plugins: PluginSet) -> PlatformChoice:
    """Exactly one platform, or :class:`PlatformSelectionError` that says why not.

    In strict mode a probe that raised is an error even when another platform won."""
    choice, explanation = explain_platform(plugins)
    if choice is None:
        raise PlatformSelectionError(explanation.rule + "\n" + explanation.render())
    if plugins.settings.strict and explanation.failures:
        failed = "; ".join(f"{c.name}: {c.reason}" for c in explanation.failures)
        raise PlatformSelectionError(f"platform probe failed with OMNI_STRICT_PLUGINS=1: {failed}")
    return choice


_CURRENT: Platform | None = None


def current_platform() -> Platform:
    """The platform of this process, selected on first access and cached."""
    global _CURRENT
    if _CURRENT is None:
        from omni_core.plugins import get_plugins

        _CURRENT = select_platform(get_plugins()).instantiate()
    return _CURRENT


def reset_platform() -> None:
    global _CURRENT
    _CURRENT = None


@contextlib.contextmanager
def use_platform(platform: Platform) -> Iterator[Platform]:
    """Temporarily make ``platform`` the current one (tests, benchmarks)."""
    global _CURRENT
    previous, _CURRENT = _CURRENT, platform
    try:
        yield platform
    finally:
        _CURRENT = previous


__all__ = [
    "MemoryInfo",
    "OmniError",
    "Platform",
    "PlatformChoice",
    "ProbeResult",
    "current_platform",
    "explain_platform",
    "probe_timeout",
    "run_probe",
    "select_platform",
    "use_platform",
]
