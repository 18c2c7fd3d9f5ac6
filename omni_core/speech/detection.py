"""Which TTS adapter serves a model: first match in (detect_priority, name) order, where two
matches at the same priority are an error naming both plugins, never a silent first pick."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import TTSDetectionError as TTSDetectionError
from omni_core.inputs import read_checkpoint_json
from omni_core.selection import Explanation, Outcome

if TYPE_CHECKING:
    from omni_core.plugins import PluginSet
    from omni_core.registry import Registered, TTSAdapterSpec


@dataclass(frozen=True)
class ModelIdentity:
    """What detection reads from a checkpoint directory."""

    model_dir: Path
    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    model_stage: str | None = None
    config: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def arch(self) -> str | None:
        return self.architectures[0] if self.architectures else None

    @classmethod
    def from_dir(cls, model_dir: str | Path, model_stage: str | None = None) -> ModelIdentity:
        path = Path(model_dir).expanduser()
        config_file = path / "config.json"
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


def explain_tts(
    plugins: PluginSet, identity: ModelIdentity, adapter: str | None = None
) -> tuple[Registered[TTSAdapterSpec] | None, Explanation]:
    """Detect the adapter for ``identity`` (or honour an explicit ``adapter`` name) and say why.
    Raises :class:`TTSDetectionError` when two adapters at the same priority both match."""
    what = f"arch={identity.arch or '-'}, model_type={identity.model_type or '-'}, stage={identity.model_stage or '-'}"
    explanation = Explanation(f"tts adapter for {identity.model_dir.name} ({what})")
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
