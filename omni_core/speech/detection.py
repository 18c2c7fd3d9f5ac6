"""Which TTS adapter serves a model: first match in (detect_priority, name) order, where two
matches at the same priority are an error naming both plugins, never a silent first pick.

A model is a checkpoint directory with a ``config.json``, or, through the adapters' optional
hooks (:meth:`~omni_core.speech.adapter.TTSAdapter.identify`,
:meth:`~omni_core.speech.adapter.TTSAdapter.installed_models`), a file or directory an adapter
claims from its own files, or the short name of an installed model: :func:`locate_model`
turns any of them into a :class:`ModelIdentity`. :func:`ready_models` lists the real models
adapters offer as the default voice
(:meth:`~omni_core.speech.adapter.TTSAdapter.ready_model`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from omni_core.errors import OmniError

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import TTSDetectionError as TTSDetectionError
from omni_core.inputs import read_checkpoint_json
from omni_core.selection import Explanation, Outcome

if TYPE_CHECKING:
    from omni_core.plugins import PluginSet
    from omni_core.registry import Registered, TTSAdapterSpec
    from omni_core.speech.adapter import ModelClaim, ReadyModel, TTSAdapter


@dataclass(frozen=True)
class ModelIdentity:
    """What detection reads from a checkpoint directory."""

    model_dir: Path
    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    model_stage: str | None = None
    config: dict[str, Any] = field(default_factory=dict, compare=False)
    #: for a model without ``config.json``: the adapter that claimed it and why
    claim: str | None = None
    #: what to call it in messages: the name or file it was given as (default: the directory's name)
    label: str | None = field(default=None, compare=False)

    @property
    def shown_name(self) -> str:
        return self.label or self.model_dir.name

    @property
    def arch(self) -> str | None:
        return self.architectures[0] if self.architectures else None

    @classmethod
    def from_claim(cls, claim: ModelClaim, model_stage: str | None, by: str, label: str | None = None) -> ModelIdentity:
        """The identity of a model an adapter claimed (:meth:`TTSAdapter.identify`)."""
        config = dict(claim.config)
        archs = config.get("architectures") or ()
        model_type = config.get("model_type")
        return cls(
            Path(claim.model_dir),
            (archs,) if isinstance(archs, str) else tuple(str(a) for a in archs),
            model_type if isinstance(model_type, str) else None,
            model_stage,
            config,
            f"{by}: {claim.reason}",
            label,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path, model_stage: str | None = None) -> ModelIdentity:
        path = Path(model_dir).expanduser()
        config_file = path / "config.json"
        if path.is_file():
            raise TTSDetectionError(
                f"{str(path)!r} is a file that no installed TTS adapter claims; point --model at a checkpoint "
                "directory (with its config.json), or install the plugin for this model format"
            )
        if not path.is_dir():
            raise TTSDetectionError(f"model directory {str(path)!r} does not exist")
        if not config_file.is_file():
            raise TTSDetectionError(
                f"{str(path)!r} has no config.json, so it is not a checkpoint omni can identify; "
                "point --model at the directory a model's save_pretrained() wrote"
            )
        config = read_checkpoint_json(config_file) or {}  # malformed: CheckpointFormatError, naming it
        archs = config.get("architectures") or ()
        if isinstance(archs, str):
            archs = (archs,)
        elif not isinstance(archs, (list, tuple)):
            archs = ()
        model_type = config.get("model_type")
        return cls(
            path,
            tuple(str(a) for a in archs),
            model_type if isinstance(model_type, str) else None,
            model_stage,
            config,
        )


def _adapter_classes(plugins: PluginSet) -> Iterator[tuple[str, type[TTSAdapter]]]:
    """The active adapters' classes in detection order. One that fails to import is left out
    here: :func:`explain_tts` reports it as a failed candidate."""
    for entry in sorted(plugins.tts_adapters, key=lambda e: (e.spec.detect_priority, e.name)):
        try:
            cls = entry.load()
        except Exception:
            continue
        yield entry.name, cls


def _asked(adapter: str, hook: str, call: Any) -> Any:
    """One adapter's answer to an optional detection hook. omni's own errors (a claimed model
    that cannot be served as it is) pass through; a plugin's bug is named, not a traceback."""
    try:
        return call()
    except OmniError:
        raise
    except Exception as exc:
        raise TTSDetectionError(
            f"TTS adapter {adapter!r} failed in {hook}(): {type(exc).__name__}: {exc}; "
            "report this to the plugin's authors, or choose another adapter with --adapter NAME"
        ) from exc


class InstalledModel(NamedTuple):
    """A model an adapter knows by a short name (:meth:`TTSAdapter.installed_models`)."""

    name: str
    path: Path
    adapter: str


def installed_models(plugins: PluginSet) -> dict[str, InstalledModel]:
    """Every installed model the active adapters know by a short name, by the name casefolded
    (names compare case-insensitively). The first adapter in detection order keeps a name two
    adapters share."""
    names: dict[str, InstalledModel] = {}
    for adapter, cls in _adapter_classes(plugins):
        known = _asked(adapter, "installed_models", cls.installed_models)
        for name, path in known.items():
            names.setdefault(str(name).casefold(), InstalledModel(str(name), Path(path), adapter))
    return names


class OfferedModel(NamedTuple):
    """A real model an adapter offers as the default voice (:meth:`TTSAdapter.ready_model`)."""

    model: ReadyModel
    adapter: str


def ready_models(plugins: PluginSet) -> list[OfferedModel]:
    """What the active adapters offer as the default voice, best first: by the offer's
    ``preference``, then the adapter's name. Empty when none offers one (the caller falls
    back to a tiny random checkpoint, and says so)."""
    offers = []
    for adapter, cls in _adapter_classes(plugins):
        offered = _asked(adapter, "ready_model", cls.ready_model)
        if offered is not None:
            offers.append(OfferedModel(offered, adapter))
    return sorted(offers, key=lambda o: (o.model.preference, o.adapter))


def claim_model(plugins: PluginSet, model: str | Path, model_stage: str | None = None) -> ModelIdentity | None:
    """The identity of a model only an adapter can recognise: the short name of an installed
    model, or a file or a directory without ``config.json`` that an adapter's
    :meth:`~omni_core.speech.adapter.TTSAdapter.identify` claims. None for anything else (a
    checkpoint directory with its ``config.json``, a path nothing claims)."""
    path = Path(model).expanduser()
    label = path.name
    if not path.exists():
        named = installed_models(plugins).get(str(model).casefold())
        if named is None:
            return None
        path, label = named.path, named.name
    elif path.is_dir() and (path / "config.json").is_file():
        return None
    for adapter, cls in _adapter_classes(plugins):
        claim = _asked(adapter, "identify", lambda c=cls: c.identify(path))
        if claim is not None:
            return ModelIdentity.from_claim(claim, model_stage, adapter, label)
    return None


def locate_model(plugins: PluginSet, model: str | Path, model_stage: str | None = None) -> ModelIdentity:
    """What detection reads from ``model``: a checkpoint directory, a file or directory an
    adapter claims, or an installed model's short name. Raises :class:`TTSDetectionError`
    naming the installed models when ``model`` is neither a path nor one of their names."""
    identity = claim_model(plugins, model, model_stage)
    if identity is not None:
        return identity
    if not Path(model).expanduser().exists():
        names = installed_models(plugins)
        if names:
            listed = ", ".join(f"{m.name} ({m.adapter})" for _, m in sorted(names.items()))
            raise TTSDetectionError(
                f"model {str(model)!r} is neither a directory nor the name of an installed model (installed: "
                f"{listed}); point --model at a checkpoint directory or name one of these"
            )
    return ModelIdentity.from_dir(model, model_stage)


def explain_tts(
    plugins: PluginSet, identity: ModelIdentity, adapter: str | None = None
) -> tuple[Registered[TTSAdapterSpec] | None, Explanation]:
    """Detect the adapter for ``identity`` (or honour an explicit ``adapter`` name) and say why.
    Raises :class:`TTSDetectionError` when two adapters at the same priority both match."""
    what = f"arch={identity.arch or '-'}, model_type={identity.model_type or '-'}, stage={identity.model_stage or '-'}"
    if identity.claim:  # no config.json: say whose reading of the files gave these
        what += f"; identified by {identity.claim}"
    explanation = Explanation(f"tts adapter for {identity.shown_name} ({what})")
    registry = plugins.tts_adapters
    if adapter:
        entry = registry.get(adapter)  # raises, naming the installed adapters
        cls = entry.load()
        explanation.add(entry.name, Outcome.SELECTED, "chosen explicitly", str(entry.provider))
        if not cls.matches(identity.model_stage, identity.arch):
            explanation.candidates[
                -1
            ].reason += " (it does not claim this model: expect it to fail if it cannot load it)"
        explanation.winner, explanation.rule = entry.name, "explicit choice"
        return entry, explanation

    entries = sorted(registry, key=lambda e: (e.spec.detect_priority, e.name))
    winner: Registered[TTSAdapterSpec] | None = None
    for entry in entries:
        try:
            cls = entry.load()
            claims = bool(cls.matches(identity.model_stage, identity.arch))
        except Exception as exc:
            explanation.add(entry.name, Outcome.FAILED, f"{type(exc).__name__}: {exc}", str(entry.provider))
            continue
        priority = entry.spec.detect_priority
        if not claims:
            explanation.add(entry.name, Outcome.REJECTED, f"does not match (priority {priority})", str(entry.provider))
        elif winner is None:
            winner = entry
            explanation.add(entry.name, Outcome.SELECTED, f"matches (priority {priority})", str(entry.provider))
        elif priority == winner.spec.detect_priority:
            raise TTSDetectionError(
                f"TTS adapters {winner.name!r} ({winner.provider}) and {entry.name!r} ({entry.provider}) both match "
                f"{identity.model_dir} at detect_priority {priority}; give one a different detect_priority, "
                "uninstall one, or choose with --adapter NAME"
            )
        else:
            explanation.add(
                entry.name, Outcome.NOT_CONSIDERED, f"matches too, but at priority {priority}", str(entry.provider)
            )
    if winner is None:
        known = ", ".join(e.name for e in entries) or "none active"
        explanation.rule = f"no TTS adapter serves this model (adapters: {known})"
        return None, explanation
    explanation.winner, explanation.rule = winner.name, "first match in (detect_priority, name) order"
    return winner, explanation


def inactive_adapter_hints(plugins: PluginSet, identity: ModelIdentity) -> list[str]:
    """Installed adapters that would serve ``identity`` but are not active (a disabled plugin,
    safe mode, a per-kind filter, a broken plugin), each with how to turn it back on. Read from
    the manifests, so nothing is imported."""
    from omni_core.discovery import Status
    from omni_core.generation.resolve import inactive_provider
    from omni_core.kinds import Kind

    hints = []
    filtered = plugins.tts_adapters.filtered
    for record in plugins.records:
        for declared in record.manifest.of_kind(Kind.TTS_ADAPTER) if record.manifest else []:
            archs = [str(a) for a in declared.fields.get("model_archs", ())]
            stages = [str(s) for s in declared.fields.get("stage_keys", ())]
            if identity.arch and archs:
                claims = identity.arch in archs
            else:
                claims = bool(identity.model_stage) and identity.model_stage in stages
            if not claims:
                continue
            if record.status is not Status.OK:
                hints.append(f"TTS adapter {declared.name!r}: " + inactive_provider(record))
            elif declared.name.casefold() in filtered:
                hints.append(
                    f"TTS adapter {declared.name!r} ({record.distribution}) serves it but is "
                    f"{filtered[declared.name.casefold()]}"
                )
    return hints


def overlapping_adapters(plugins: PluginSet) -> list[str]:
    """Declared overlaps: adapters at the same ``detect_priority`` sharing an architecture, or a
    stage key where neither names architectures. Custom ``matches`` rules are checked at
    detection time instead."""
    problems = []
    entries = list(plugins.tts_adapters)
    for i, a in enumerate(entries):
        for b in entries[i + 1 :]:
            if a.spec.detect_priority != b.spec.detect_priority:
                continue
            shared = set(a.spec.model_archs) & set(b.spec.model_archs)
            if not a.spec.model_archs and not b.spec.model_archs:
                shared |= set(a.spec.stage_keys) & set(b.spec.stage_keys)
            if shared:
                problems.append(
                    f"TTS adapters {a.name!r} ({a.provider}) and {b.name!r} ({b.provider}) both claim "
                    f"{sorted(shared)} at detect_priority {a.spec.detect_priority}"
                )
    return problems
