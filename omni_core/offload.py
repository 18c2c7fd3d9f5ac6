"""The offloader contract: keeping a model's weights in host memory and moving them to the
compute device around their use.

An offloader is registered through ``omni_register_offloaders`` (its ``ref`` is a subclass
of :class:`Offloader`). Exactly one strategy is active per model. Each declares, as data,
what it cannot be combined with (``incompatible_with`` in its registration): other
strategies and features such as ``attention:SAGE_ATTN`` or ``family:<name>``.
:func:`choose_offloader` checks every declaration *before* anything is moved or hooked, and
fails with an error naming the declaration and who made it.

The lifecycle, driven by the model runtime::

    offloader = cls(plan, device, options)   # nothing is touched yet
    offloader.enable()                       # discover modules, park weights, install hooks
    ...                                      # forward passes; hooks move weights in and out
    offloader.disable()                      # remove hooks, bring every weight back

The model declares what to offload in an :class:`OffloadPlan` (component groups and the
dotted paths of transformer block lists), so offloaders never guess from class names.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import OffloadConfigError as OffloadConfigError
from omni_core.identity import DeclaredIdentity  # name etc. come from the registration
from omni_core.kinds import Kind
from omni_core.selection import Explanation, Outcome

if TYPE_CHECKING:
    from omni_core.platforms import Platform
    from omni_core.plugins import PluginSet


@dataclass(frozen=True)
class OffloadPlan:
    """What a model declares about its modules, by component name and dotted path."""

    #: every component: name -> module (``torch.nn.Module``); non-modules are ignored
    components: dict[str, Any]
    #: denoisers (``transformer``, ``transformer_2``): one group, on the device while denoising
    dit_modules: tuple[str, ...] = ("transformer",)
    #: conditioning encoders (``text_encoder``, ``text_encoder_2``, ``image_encoder``)
    encoder_modules: tuple[str, ...] = ()
    #: stay on the compute device throughout (the VAE decodes right after the last step)
    resident_modules: tuple[str, ...] = ("vae",)
    #: dotted paths of block lists for layer-wise offload, e.g. ``transformer.transformer_blocks``
    block_attrs: tuple[str, ...] = ()

    def module(self, dotted: str) -> Any:
        head, *rest = dotted.split(".")
        node = self.components[head]
        for part in rest:
            node = getattr(node, part)
        return node


@dataclass
class ResidencyEvent:
    """One observation made by an offloader's hook: before ``module`` ran, these were resident."""

    module: str
    resident: tuple[str, ...]


class Offloader(DeclaredIdentity, abc.ABC, identity_of=Kind.OFFLOADER):
    """One offload strategy, bound to one model."""

    name: ClassVar[str]

    def __init__(self, plan: OffloadPlan, device: Any, options: dict[str, Any] | None = None) -> None:
        self.plan = plan
        self.device = device
        self.options = dict(options or {})
        #: filled when ``record=True`` in the options: what was resident as each unit ran
        self.events: list[ResidencyEvent] = []

    def check(self) -> None:
        """Raise :class:`OffloadConfigError` if the plan cannot be served. Must not change anything."""

    @abc.abstractmethod
    def enable(self) -> None:
        """Park the weights and install the hooks. Leaves no half-installed hooks on failure."""

    @abc.abstractmethod
    def disable(self) -> None:
        """Remove the hooks and bring every weight back to the compute device."""

    @abc.abstractmethod
    def is_enabled(self) -> bool: ...

    @abc.abstractmethod
    def resident(self) -> tuple[str, ...]:
        """Names of the units (components or blocks) whose weights are on the device now."""


def offloader_contract_problems(cls: Any) -> list[str]:
    if not (isinstance(cls, type) and issubclass(cls, Offloader)):
        return [f"{cls!r} is not a subclass of omni_core.offload.Offloader"]
    problems = []
    if not isinstance(getattr(cls, "name", None), str):
        problems.append("class attribute 'name' must be a string")
    if getattr(cls, "__abstractmethods__", None):
        problems.append(f"abstract methods not implemented: {sorted(cls.__abstractmethods__)}")
    return problems


@dataclass
class OffloadChoice:
    name: str
    offloader_class: type[Offloader]
    options: dict[str, Any] = field(default_factory=dict)


def choose_offloader(
    plugins: PluginSet, requested: tuple[str, ...], features: set[str], platform: Platform | None = None
) -> tuple[OffloadChoice | None, Explanation]:
    """The one strategy to run, after checking every declared incompatibility against the other
    requested strategies and the run's ``features`` (``attention:<BACKEND>``, ``family:<name>``,
    ``platform:<name>``), and that ``platform`` (the one the model runs on) supports offload
    (:attr:`Platform.supports_offload`). Raises :class:`OffloadConfigError`; touches no model."""
    explanation = Explanation("offload strategy")
    names = [n.strip() for n in requested if n and n.strip() and n.strip().lower() != "none"]
    registry = plugins.offloaders
    if not names:
        for entry in registry:
            explanation.add(entry.name, Outcome.NOT_CONSIDERED, "offload not requested")
        explanation.rule = "no offload requested"
        return None, explanation
    if platform is not None and not platform.supports_offload:
        raise OffloadConfigError(
            f"offload ({', '.join(names)}) was requested, but the {platform.name} platform does not support "
            "offload (its supports_offload is False: weights cannot be parked in host memory and moved in on "
            "use there). Drop --offload (or the recipe's offload) on this machine"
        )
    entries = []
    for name in names:
        if name not in registry:
            known = ", ".join(registry.names()) or "none (install omni-plugin-offload)"
            raise OffloadConfigError(f"unknown offload strategy {name!r}: {registry.why_missing(name)}; known: {known}")
        entries.append(registry.get(name))
    active = {e.name.casefold() for e in entries} | {f.casefold() for f in features}
    for entry in entries:
        clashes = [c for c in entry.spec.incompatible_with if c.casefold() in active - {entry.name.casefold()}]
        if clashes:
            raise OffloadConfigError(
                f"offload strategy {entry.name!r} cannot be combined with {', '.join(clashes)} "
                f"(declared by {entry.provider.distribution}). Drop one of them."
            )
    if len(entries) > 1:
        raise OffloadConfigError(
            f"exactly one offload strategy can be active, got {', '.join(e.name for e in entries)}; choose one"
        )
    entry = entries[0]
    cls = entry.load()
    problems = offloader_contract_problems(cls)
    if problems:
        raise OffloadConfigError(f"offload strategy {entry.name!r} ({entry.provider}) is broken: {'; '.join(problems)}")
    explanation.add(entry.name, Outcome.SELECTED, "requested; no declared incompatibility applies", str(entry.provider))
    explanation.winner, explanation.rule = entry.name, "explicit choice"
    return OffloadChoice(entry.name, cls), explanation
