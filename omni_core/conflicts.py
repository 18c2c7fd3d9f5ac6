"""The one conflict policy every registry uses.

A name offered by several plugins goes to, in order:
1. the distribution pinned for it in the user config (``omni plugins pin KIND NAME DIST``);
2. the offer with the highest explicit ``priority``;
3. nobody: equal top priorities are a conflict that names both providers. The name is
   unusable until it is resolved. Never last-writer-wins, never import order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omni_core.config import normalize_dist
from omni_core.kinds import Kind
from omni_core.text import shell_arg


@dataclass(frozen=True)
class Provider:
    """Who provides something: plugin, distribution, version. ``str()`` of it is the one way
    omni names a provider, in listings, conflicts and errors alike."""

    plugin: str
    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.distribution} {self.version} (plugin {self.plugin!r})"


@dataclass(frozen=True)
class Offer:
    """One plugin offering one name of one kind."""

    kind: Kind
    name: str
    priority: int
    plugin: str
    distribution: str
    version: str
    payload: Any = field(default=None, compare=False)

    @property
    def key(self) -> tuple[Kind, str]:
        return (self.kind, self.name.casefold())

    @property
    def who(self) -> Provider:
        return Provider(self.plugin, self.distribution, self.version)

    @property
    def provider(self) -> str:
        return str(self.who)


@dataclass
class Decision:
    winner: Offer
    rule: str
    shadowed: list[Offer] = field(default_factory=list)


@dataclass
class Conflict:
    kind: Kind
    name: str
    offers: list[Offer]

    def message(self) -> str:
        who = " and ".join(o.provider for o in self.offers)
        first = self.offers[0]
        return (
            f"{self.kind.label} {self.name!r} is provided by {who} at the same priority "
            f"({first.priority}). Pick one with `omni plugins pin {self.kind.value} {shell_arg(self.name)} "
            f"{shell_arg(first.distribution)}`, or uninstall one of them."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "name": self.name,
            "providers": [
                {"plugin": o.plugin, "distribution": o.distribution, "version": o.version, "priority": o.priority}
                for o in self.offers
            ],
            "message": self.message(),
        }


@dataclass
class Resolution:
    decisions: dict[tuple[Kind, str], Decision] = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def resolve(offers: Iterable[Offer], pins: Mapping[tuple[Kind, str], str]) -> Resolution:
    groups: dict[tuple[Kind, str], list[Offer]] = {}
    for offer in offers:
        groups.setdefault(offer.key, []).append(offer)
    result = Resolution()
    for key, group in sorted(groups.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
        group.sort(key=lambda o: (-o.priority, normalize_dist(o.distribution), o.plugin))
        if len(group) == 1:
            result.decisions[key] = Decision(group[0], "only provider")
            continue
        pinned = pins.get(key)
        if pinned is not None:
            chosen = [o for o in group if normalize_dist(o.distribution) == pinned]
            if chosen:
                rest = [o for o in group if o is not chosen[0]]
                result.decisions[key] = Decision(chosen[0], f"pinned to {pinned} in the user config", rest)
                continue
            result.notes.append(f"pin {key[0].value}.{group[0].name} = {pinned!r} names no installed provider; ignored")
        top = [o for o in group if o.priority == group[0].priority]
        if len(top) == 1:
            result.decisions[key] = Decision(
                group[0], f"priority {group[0].priority} beats {group[1].priority}", group[1:]
            )
        else:
            result.conflicts.append(Conflict(key[0], group[0].name, top))
    return result
