"""Identity class attributes, derived from the registration: one fact, one place.

A TTS adapter's ``name``, ``stage_keys``, ``model_archs`` and ``detect_priority``, an
attention backend's ``name`` and ``device_types``, a platform's or an offloader's ``name``:
each is declared once, in the plugin's ``omni_plugin.toml`` (or registered from a hook), and
the core sets it on the class. It does so twice, with the same values:

* when a class of one of these kinds is *defined* (:class:`DeclaredIdentity`, a base of
  :class:`~omni_core.platforms.Platform`, :class:`~omni_core.attention.AttentionBackend`,
  :class:`~omni_core.speech.adapter.TTSAdapter` and :class:`~omni_core.offload.Offloader`), from
  the manifest entry of its own package whose ``ref`` names it, so the class is complete even
  when a test imports it directly;
* when the registry *loads* it (:func:`bind`), from the registered spec: this covers a ``ref``
  that re-exports the class from another module and classes registered by hand.

A class may still state an attribute itself (plugin API 1.0 did): then it must equal the
registration, or loading it fails with :class:`~omni_core.errors.DeclarationMismatchError`
naming both values (the conformance kit reports the same, through :func:`identity_problems`).

A model family's ``tasks`` are declared the same way; its profile's ``task`` is runtime data
(``profile_for`` may build a profile per checkpoint), so it is checked against them, not set.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

from omni_core.kinds import Kind

#: kind -> (class attribute, how the spec's value is stored on the class)
IDENTITY: dict[Kind, tuple[tuple[str, Callable[[Any], Any]], ...]] = {
    Kind.PLATFORM: (("name", str),),
    Kind.ATTENTION_BACKEND: (("name", str), ("device_types", tuple)),
    Kind.TTS_ADAPTER: (
        ("name", str),
        ("stage_keys", frozenset),
        ("model_archs", frozenset),
        ("detect_priority", int),
    ),
    Kind.OFFLOADER: (("name", str),),
    Kind.CONNECTOR: (("name", str),),
    Kind.EXECUTOR: (("name", str),),
    Kind.CACHE_BACKEND: (("name", str),),
}

#: set in a class's own ``__dict__``: the attributes the core filled in (never stated by its author)
_FILLED = "__omni_identity__"


def _same(attr: str, have: Any, want: Any) -> bool:
    if attr == "name":  # registry names are case-insensitive
        return isinstance(have, str) and have.casefold() == want.casefold()
    if isinstance(want, frozenset):
        return isinstance(have, (set, frozenset, tuple, list)) and frozenset(have) == want
    if isinstance(want, tuple):
        return isinstance(have, (tuple, list)) and tuple(have) == want
    return bool(have == want)


def _stated(cls: type, attr: str) -> tuple[bool, Any]:
    """Whether the plugin's author states ``attr`` (on ``cls`` or a base of theirs), and the value.

    A value set by the core (from the manifest) or a default of an ``omni_core`` base class is
    not the author's statement."""
    for klass in cls.__mro__:
        if attr in vars(klass):
            if attr in vars(klass).get(_FILLED, ()) or klass.__module__.split(".")[0] == "omni_core":
                return False, None
            return True, vars(klass)[attr]
    return False, None


def _fill(cls: type, values: dict[str, Any]) -> None:
    for attr, value in values.items():
        setattr(cls, attr, value)
    setattr(cls, _FILLED, frozenset(vars(cls).get(_FILLED, ())) | set(values))


def identity_values(kind: Kind, spec: Any) -> dict[str, Any]:
    """The class attributes a registration of ``kind`` implies, from its spec (or Declared)."""
    out = {}
    for attr, convert in IDENTITY.get(kind, ()):
        value = getattr(spec, attr) if hasattr(spec, attr) else spec.fields.get(attr)
        out[attr] = convert(value)
    return out


def identity_problems(obj: Any, kind: Kind, spec: Any) -> list[str]:
    """Where the class ``obj`` states an identity attribute that differs from ``spec``."""
    if not isinstance(obj, type):
        return []
    problems = []
    for attr, want in identity_values(kind, spec).items():
        stated, have = _stated(obj, attr)
        filled = attr in vars(obj).get(_FILLED, ())
        if not stated and filled and attr == "name" and not _same(attr, vars(obj)[attr], want):
            # named by another registration: one class cannot serve two names (its other filled
            # attributes just follow the latest registration of its one name)
            stated, have = True, vars(obj)[attr]
        if stated and not _same(attr, have, want):
            problems.append(f"{obj.__name__}.{attr} is {have!r}, but {spec.name!r} is declared with {want!r}")
    tasks = tuple(getattr(spec, "tasks", None) or ()) if kind is Kind.MODEL else ()
    task = getattr(getattr(obj, "profile", None), "task", None)
    if tasks and task is not None and task not in tasks:
        problems.append(f"{obj.__name__}.profile.task is {task!r}, not among the declared tasks {list(tasks)}")
    return problems


def bind(obj: Any, kind: Kind, spec: Any, plugin: str = "") -> None:
    """Set the identity attributes of a just-loaded class from its registered spec.

    Raises :class:`~omni_core.errors.DeclarationMismatchError` when the class states one of
    them differently."""
    if not isinstance(obj, type):
        return
    problems = identity_problems(obj, kind, spec)
    if problems:
        from omni_core.errors import DeclarationMismatchError

        who = f" (plugin {plugin!r})" if plugin else ""
        raise DeclarationMismatchError(
            f"{kind.label} {spec.name!r}{who}: " + "; ".join(problems) + ". The registration "
            "(omni_plugin.toml) is the one source of these attributes: remove them from the class, "
            "or make the two agree"
        )
    if not issubclass(obj, DeclaredIdentity):  # not a class of the kind's base: nothing to set on it
        return
    missing = {a: v for a, v in identity_values(kind, spec).items() if not _stated(obj, a)[0]}
    if missing:
        _fill(obj, missing)


@functools.lru_cache(maxsize=256)
def _manifest_of(package: str) -> Any:
    from omni_core.manifest import read_manifest

    try:
        return read_manifest(package)
    except Exception:  # not a plugin package, or a broken manifest (discovery reports that)
        return None


def _fill_from_manifest(cls: type, kind: Kind) -> None:
    module = getattr(cls, "__module__", "") or ""
    if not module or module.split(".")[0] == "omni_core":
        return
    manifest = _manifest_of(module.split(".")[0])
    if manifest is None:
        return
    ref = f"{module}:{cls.__qualname__}"
    found = [d for d in manifest.of_kind(kind) if d.ref == ref]
    if len(found) != 1:
        return
    try:
        from omni_core.registry import SPEC_TYPES

        declared = found[0]
        spec = SPEC_TYPES[kind](name=declared.name, ref=declared.ref, priority=declared.priority, **declared.fields)
    except Exception:  # invalid fields: the loader reports the manifest
        return
    missing = {a: v for a, v in identity_values(kind, spec).items() if not _stated(cls, a)[0]}
    if missing:
        _fill(cls, missing)


class DeclaredIdentity:
    """Base of the core's base classes whose identity a manifest declares.

    ``class TTSAdapter(DeclaredIdentity, abc.ABC, identity_of=Kind.TTS_ADAPTER)`` names the
    kind; every subclass then gets its identity attributes from the manifest entry of its own
    package whose ``ref`` is ``module:QualName``, when it is defined (see the module docstring)."""

    _identity_kind: ClassVar[Kind | None] = None

    def __init_subclass__(cls, identity_of: Kind | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if identity_of is not None:
            cls._identity_kind = identity_of
        elif cls._identity_kind is not None:
            _fill_from_manifest(cls, cls._identity_kind)
