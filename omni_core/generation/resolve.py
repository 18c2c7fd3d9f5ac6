"""Which registered model family serves a checkpoint directory, and why.

Precedence, first that applies wins:

1. an explicit class or family name (``--model-class-name`` / ``model_class_name=``);
2. the recipe's pin (``model_class_name:`` in a recipe);
3. ``model_index.json``'s ``_class_name`` (the diffusers layout);
4. ``config.json``'s ``architectures``, then ``model_type`` (the transformers layout).

A name matches a family's registered name, one of its ``architectures`` or an alias (renamed
classes keep working). Families that share a name are told apart by their ``config_match``
predicates, read from the checkpoint's configs; never by load order. Nothing here imports a
family's code: specs and JSON files only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import ModelResolutionError as ModelResolutionError
from omni_core.inputs import read_checkpoint_json
from omni_core.kinds import Kind
from omni_core.manifest import answers_to, fold, names_of
from omni_core.selection import Explanation, Outcome

if TYPE_CHECKING:
    from omni_core.plugins import PluginSet
    from omni_core.registry import ModelSpec, Registered


_ABSENT = object()


@dataclass
class Checkpoint:
    """The configs of a checkpoint directory, read lazily and at most once each."""

    directory: Path
    _configs: dict[str, Any] = field(default_factory=dict)

    def config(self, component: str) -> dict[str, Any] | None:
        """``model_index`` (model_index.json), ``config`` (config.json) or a subfolder's
        ``config.json`` (``scheduler``: its ``scheduler_config.json``). None when the file is
        absent; :class:`~omni_core.errors.CheckpointFormatError` when it is malformed."""
        if component not in self._configs:
            if component == "model_index":
                path = self.directory / "model_index.json"
            elif component == "config":
                path = self.directory / "config.json"
            else:  # a model's config.json, or a scheduler's scheduler_config.json
                path = self.directory / component / "config.json"
                if not path.is_file():
                    path = self.directory / component / f"{component}_config.json"
            # absent is None; present but malformed is an error naming the file, never "missing"
            self._configs[component] = read_checkpoint_json(path)
        return self._configs[component]  # type: ignore[no-any-return]

    @property
    def class_name(self) -> str | None:
        """``model_index.json``'s ``_class_name`` when it is a diffusers checkpoint."""
        index = self.config("model_index")
        if index and isinstance(index.get("_class_name"), str) and "_diffusers_version" in index:
            return str(index["_class_name"])
        return None

    @property
    def architectures(self) -> list[str]:
        cfg = self.config("config") or {}
        archs = cfg.get("architectures") or []
        return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []

    @property
    def model_type(self) -> str | None:
        value = (self.config("config") or {}).get("model_type")
        return value if isinstance(value, str) else None

    def lookup(self, dotted: str) -> Any:
        """The value at ``component.key[.key...]``, or a sentinel when absent."""
        component, *keys = dotted.split(".")
        node: Any = self.config(component)
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return _ABSENT
            node = node[key]
        return _ABSENT if node is None and keys else node

    def check(self, predicate: dict[str, Any]) -> tuple[bool, str]:
        """Whether every ``config_match`` entry holds, and a readable account of the first that fails."""
        for key, want in predicate.items():
            have = self.lookup(key)
            if isinstance(want, dict) and set(want) == {"exists"}:
                if (have is not _ABSENT) != bool(want["exists"]):
                    return False, f"{key} {'is absent' if have is _ABSENT else 'is present'}"
            elif have is _ABSENT or have != want:
                shown = "absent" if have is _ABSENT else repr(have)
                return False, f"{key} is {shown}, not {want!r}"
        return True, " and ".join(f"{k} matches" for k in predicate) or "no predicate"


@dataclass
class ModelResolution:
    entry: Registered[ModelSpec]
    explanation: Explanation
    #: which rule decided: "explicit", "recipe", "model_index", "architectures", "model_type"
    rule: str

    @property
    def family(self) -> str:
        return self.entry.name


def _families_named(plugins: PluginSet, name: str) -> list[Registered[ModelSpec]]:
    return [e for e in plugins.models if answers_to(e.spec, name, architectures=True)]


def _families_of_type(plugins: PluginSet, model_type: str) -> list[Registered[ModelSpec]]:
    return [e for e in plugins.models if model_type in e.spec.model_types]


def _pick_sibling(
    candidates: list[Registered[ModelSpec]], checkpoint: Checkpoint, what: str, explanation: Explanation
) -> Registered[ModelSpec]:
    """One family among those sharing ``what``: a predicate that holds beats no predicate."""
    if len(candidates) == 1 and not candidates[0].spec.config_match:
        explanation.add(
            candidates[0].name, Outcome.SELECTED, f"the only family serving {what}", str(candidates[0].provider)
        )
        return candidates[0]
    holding, fallback = [], []
    for entry in candidates:
        if entry.spec.config_match:
            ok, account = checkpoint.check(entry.spec.config_match)
            explanation.add(entry.name, Outcome.SELECTED if ok else Outcome.REJECTED, account, str(entry.provider))
            if ok:
                holding.append(entry)
        else:
            fallback.append(entry)
    if len(holding) == 1:
        for entry in fallback:
            explanation.add(entry.name, Outcome.REJECTED, "a sibling's config predicate matched", str(entry.provider))
        return holding[0]
    if not holding and len(fallback) == 1:
        explanation.add(
            fallback[0].name, Outcome.SELECTED, "no sibling's predicate matched; it has none", str(fallback[0].provider)
        )
        return fallback[0]
    tied = holding or fallback
    who = ", ".join(f"{e.name} ({e.provider.distribution})" for e in tied) or "none"
    if not tied:
        raise ModelResolutionError(
            f"{what} is served by {', '.join(e.name for e in candidates)}, but the checkpoint matches none of "
            f"their config predicates:\n{explanation.render()}\nName the family with --model-class-name."
        )
    raise ModelResolutionError(
        f"{what} is claimed by several families that this checkpoint cannot tell apart: {who}. "
        "Name one with --model-class-name (the family name), or ask the plugin authors to add a config_match."
    )


def ambiguous_families(plugins: PluginSet) -> list[str]:
    """Class names that several families claim in a way no checkpoint can settle: more than one
    without a predicate, or two with the same predicate (``omni doctor`` reports them)."""
    claims: dict[str, list[Registered[ModelSpec]]] = {}
    for entry in plugins.models:
        for name in dict.fromkeys(n.casefold() for n in (*entry.spec.architectures, *entry.spec.aliases)):
            claims.setdefault(name, []).append(entry)
    problems = []
    for name, entries in sorted(claims.items()):
        bare = [e for e in entries if not e.spec.config_match]
        predicates = [json.dumps(e.spec.config_match, sort_keys=True) for e in entries if e.spec.config_match]
        who = ", ".join(f"{e.name} ({e.provider.distribution})" for e in entries)
        if len(bare) > 1:
            problems.append(f"{name} is claimed by {who}, and more than one has no config_match to tell them apart")
        elif len(predicates) != len(set(predicates)):
            problems.append(f"{name} is claimed by {who}, and two of them declare the same config_match")
    return problems


def known_names(plugins: PluginSet) -> list[str]:
    """Every family name, architecture and alias the installed plugins serve."""
    return sorted({n for e in plugins.models for n in names_of(e.spec, architectures=True)})


def provider_hint(plugins: PluginSet, name: str) -> str:
    """Which plugin would provide ``name``: an installed but inactive one, or a catalog entry."""
    key = fold(name)
    for record in plugins.records:
        manifest = record.manifest
        if manifest is None:
            continue
        for declared in manifest.of_kind(Kind.MODEL):
            if answers_to(declared, name, architectures=True):
                return inactive_provider(record)
    for record in plugins.records:
        for dist, served in (record.manifest.catalog if record.manifest else {}).items():
            if key in {fold(n) for n in served}:
                return f"it is provided by {dist}: pip install {dist}"
    return ""


def inactive_provider(record: Any) -> str:
    """``record`` (a plugin that is not active) provides what was asked for: say so, why it is
    inactive ("disabled" for a plugin turned off on purpose) and how to turn it back on."""
    from omni_core.discovery import Status

    who = record.distribution
    if record.status is Status.DISABLED:
        reason = record.reason or "filtered"
        if "safe mode" in reason:
            fix = "run without --safe-mode, with OMNI_SAFE_MODE unset"
        else:
            fix = record.fix or "`omni plugins list --all` says how"
            if "OMNI_DISABLE_PLUGINS" in reason:
                fix += f" (or take {record.name} out of OMNI_DISABLE_PLUGINS)"
        return f"{who} provides it (plugin {record.name!r}) but is disabled ({reason}); to use it: {fix}"
    fix = record.fix or "`omni doctor` says how to fix it"
    return f"{who} provides it (plugin {record.name!r}) but is inactive ({record.status}: {record.reason}); {fix}"


def _unknown(plugins: PluginSet, name: str, source: str) -> ModelResolutionError:
    hint = provider_hint(plugins, name)
    known = ", ".join(known_names(plugins)) or "none (install a model family plugin)"
    return ModelResolutionError(
        f"Model class {name!r} ({source}) not found in the model registry; "
        + (f"{hint}. " if hint else "no installed or catalogued plugin provides it. ")
        + f"Known: {known}. Override with --model-class-name if the checkpoint names an old or custom class."
    )


def resolve_model(
    plugins: PluginSet,
    model_dir: Path,
    *,
    model_class_name: str | None = None,
    recipe_pin: str | None = None,
) -> ModelResolution:
    """Choose the family for ``model_dir``; raises :class:`ModelResolutionError` with the fix."""
    checkpoint = Checkpoint(Path(model_dir))
    explanation = Explanation(f"model family for {model_dir}")
    for given, rule, source in (
        (model_class_name, "explicit", "--model-class-name"),
        (recipe_pin, "recipe", "the recipe's model_class_name pin"),
    ):
        if not given:
            explanation.add(source, Outcome.NOT_CONSIDERED, "not given")
            continue
        exact = [e for e in plugins.models if fold(e.name) == fold(given)]
        if exact:  # a family named outright is taken as is: the user overrides any predicate
            explanation.add(exact[0].name, Outcome.SELECTED, f"named by {source}", str(exact[0].provider))
            return _done(explanation, exact[0], rule, f"{source} names the family {exact[0].name}")
        candidates = _families_named(plugins, given)
        if not candidates:
            raise _unknown(plugins, given, source)
        entry = _pick_sibling(candidates, checkpoint, f"{given!r} ({source})", explanation)
        return _done(explanation, entry, rule, f"{source} names {given}")

    class_name = checkpoint.class_name
    if class_name:
        candidates = _families_named(plugins, class_name)
        if not candidates:
            raise _unknown(plugins, class_name, "model_index.json _class_name")
        entry = _pick_sibling(candidates, checkpoint, f"{class_name} (model_index.json)", explanation)
        return _done(explanation, entry, "model_index", f"model_index.json names {class_name}")

    for arch in checkpoint.architectures:
        candidates = _families_named(plugins, arch)
        if candidates:
            entry = _pick_sibling(candidates, checkpoint, f"{arch} (config.json architectures)", explanation)
            return _done(explanation, entry, "architectures", f"config.json architectures name {arch}")
    model_type = checkpoint.model_type
    if model_type:
        candidates = _families_of_type(plugins, model_type)
        if candidates:
            entry = _pick_sibling(candidates, checkpoint, f"model_type {model_type!r}", explanation)
            return _done(explanation, entry, "model_type", f"config.json model_type is {model_type}")
    if checkpoint.architectures or model_type:
        raise _unknown(plugins, (checkpoint.architectures or [model_type or ""])[0], "config.json")
    raise ModelResolutionError(
        f"{model_dir} is not a checkpoint omni can identify: it has neither model_index.json (with _class_name "
        "and _diffusers_version) nor a config.json with architectures or model_type. Point --model at the "
        "checkpoint's root directory, or name the family with --model-class-name."
    )


def _done(explanation: Explanation, entry: Registered[ModelSpec], rule: str, why: str) -> ModelResolution:
    explanation.winner, explanation.rule = entry.name, why
    return ModelResolution(entry, explanation, rule)
