"""The omni plugin contract. This file is the documentation of every hook.

A plugin is a distribution with an entry point in the ``omni.plugins`` group pointing at a
module of hook implementations, plus an ``omni_plugin.toml`` manifest declaring what those
hooks register (see :mod:`omni_core.manifest`).

A plugin whose registrations are static (plugin API 1.1) writes them in the manifest only,
and its hook module is one line, implementations of every ``omni_register_*`` hook that
register exactly what the manifest declares (:mod:`omni_core.declared`)::

    from omni_core.declared import *  # noqa: F403

A plugin that decides at load time what to register writes the hooks itself::

    from omni_core import hookimpl

    @hookimpl
    def omni_register_platforms(registry):
        registry.register("cpu", "my_plugin.platform:CpuPlatform",
                          probe="my_plugin.platform:probe", priority=-100)

Rules that hold for every ``omni_register_*`` hook:

* **When:** once per process, the first time anything asks for plugins (``omni`` commands
  other than the recovery ones, ``Omni(...)``, a stage process starting). Every process
  registers for itself, so spawned workers see the same plugins.
* **What it receives:** a typed registrar bound to this plugin. Call ``registry.register``
  once per name. Registrations are validated at once; a bad one raises and the plugin is
  skipped as a whole.
* **Returns:** nothing. The core owns validation, conflicts (pin > priority > error) and
  laziness: ``ref`` strings are imported only on first use, so hook modules must import
  nothing heavy (no torch, no vendor SDK, no driver calls).
* **Must match the manifest:** everything registered must be declared in
  ``omni_plugin.toml`` with the same fields, and everything declared must be registered.
  Otherwise the plugin is reported as ``metadata-mismatch`` and skipped. (The hooks of
  :mod:`omni_core.declared` register the manifest itself, so they always match.)
* **Identity comes from the registration:** a registered class's ``name`` and the other
  identity attributes of its kind (``device_types``; ``stage_keys``, ``model_archs``,
  ``detect_priority``) are set on it by the core (:mod:`omni_core.identity`); a class that
  states one differently fails to load.
* **One plugin at a time:** the core calls each plugin's own implementation directly, not
  through pluggy's fan-out, so that a failure is attributed to its plugin, skips that plugin
  only, and never leaves the others half registered. It is also what makes the manifest
  check per plugin: each plugin's registrations are compared with its own manifest before the
  next plugin runs, and a mismatch drops that plugin alone.
* **The base of each kind** (what ``ref`` names): platform: :class:`omni_core.platforms.Platform`;
  attention backend: :class:`omni_core.attention.AttentionBackend` (its per-call kernel an
  :class:`omni_core.attention.AttentionImpl`); model: the
  :class:`omni_core.generation.model.GenerationModel` protocol; TTS adapter:
  :class:`omni_core.speech.adapter.TTSAdapter`; offloader: :class:`omni_core.offload.Offloader`;
  connector: :class:`omni_core.pipeline.connector.Connector`; executor:
  :class:`omni_core.pipeline.executor.StageExecutor`; stage engine:
  :class:`omni_core.pipeline.stage.StageEngine`; cache backend:
  :class:`omni_core.cache.CacheBackend`; command: a Typer app or a function.
* **Failure:** an exception skips this plugin (status ``hook-failed``) and everything else
  keeps working; with ``OMNI_STRICT_PLUGINS=1`` it is an error. ``sys.exit()`` and a
  ``KeyboardInterrupt`` the plugin raises itself count as failures too (only the user's own
  Ctrl-C stops omni), and a plugin that ends the process (``os._exit``) is named by the next
  command (:mod:`omni_core.breadcrumb`).

Implementations may accept a subset of a hook's arguments, so hooks can grow new arguments
without breaking old plugins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # the registrars import pydantic; this module stays import-light
    from omni_core.registry import (
        AttentionBackendRegistrar,
        CacheBackendRegistrar,
        CommandRegistrar,
        ConnectorRegistrar,
        ExecutorRegistrar,
        ModelRegistrar,
        OffloaderRegistrar,
        PlatformRegistrar,
        StageEngineRegistrar,
        TTSAdapterRegistrar,
    )
    from omni_core.runtime_config import OmniConfig

PROJECT_NAME = "omni"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Decorate hook implementations in a plugin with this marker.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def omni_register_platforms(registry: PlatformRegistrar) -> None:
    """Register hardware platforms.

    Each registration names a :class:`omni_core.platforms.Platform` subclass (``ref``) and a
    *probe* (``probe="module:function"``) that answers "is this hardware here?" as a
    :class:`omni_core.platforms.ProbeResult` (a bool is accepted). Probes run at selection
    time, must not import torch or initialise a driver (look for device files, libraries or
    environment), and may raise: the error is recorded and shown by ``omni doctor``, never
    turned into a silent fallback. Exactly one platform wins: ``OMNI_PLATFORM`` forces one,
    otherwise the highest ``priority`` among the probes that claim the machine; a tie is an error.
    """


@hookspec
def omni_register_attention_backends(registry: AttentionBackendRegistrar) -> None:
    """Register attention backends by name (``TORCH_SDPA``, ``FLASH_ATTN``, ...).

    ``ref`` names an :class:`omni_core.attention.AttentionBackend` subclass, which declares
    what it supports and whether it can run here. ``device_types`` (where it runs; empty:
    anywhere) is declared here, so listings show it without importing the class, and the core
    sets the class attribute of that name from it. Names are global: a vendor serves a shared
    name such as ``FLASH_ATTN`` with its own kernel by registering the kernel under its own
    name and mapping the shared name to it in its platform's ``attention_aliases``.
    """


@hookspec
def omni_register_models(registry: ModelRegistrar) -> None:
    """Register model families.

    ``architectures`` and ``model_types`` say which checkpoints the family serves (the
    ``model_index.json`` ``_class_name``, the HF ``architectures`` or ``model_type``);
    ``aliases`` keeps old names resolving (a registry lookup by an alias finds the model).
    ``ref`` is imported only when the model is used; for an image or video family it follows
    the :class:`omni_core.generation.model.GenerationModel` protocol (diffusers families
    subclass ``omni_plugin_diffusion.DiffusersFamily``), and its profile's ``task`` must be one
    of the declared ``tasks`` (checked when it loads).
    """


@hookspec
def omni_register_tts_adapters(registry: TTSAdapterRegistrar) -> None:
    """Register text-to-speech adapters.

    ``stage_keys`` and ``model_archs`` drive detection (within an adapter's ``matches``, an
    architecture match beats a stage key); ``detect_priority`` orders detection across
    adapters, lower first, and the first match wins. The core sets the class attributes of
    the same names (and ``name``) on the :class:`omni_core.speech.adapter.TTSAdapter`
    subclass ``ref`` names. The contract for detection:
    two adapters with the same ``detect_priority`` that can match the same model are an
    error when the speech runtime starts, never a silent first match.
    """


@hookspec
def omni_register_connectors(registry: ConnectorRegistrar) -> None:
    """Register connectors that move payloads between stage processes.

    ``ref`` is a :class:`omni_core.pipeline.connector.Connector` subclass: every process of a
    pipeline builds its own instance as ``cls(extra, context)``, ``extra`` being the recipe's
    options for it (checked against its ``options_type`` before any process starts). The
    pipeline picks a connector per edge by name (``pipeline.edges[].connector`` in a recipe; by
    default ``inprocess`` within one process and ``shm`` across processes). Connectors are
    transport only: they move a payload and hand back a small handle; the orchestrator alone
    decides where it goes.
    """


@hookspec
def omni_register_offloaders(registry: OffloaderRegistrar) -> None:
    """Register memory offload strategies (model-level, layer-wise, ...).

    ``ref`` is an :class:`omni_core.offload.Offloader` subclass. The contract for the runtime
    that applies them: exactly one strategy is active at a time, and each class declares what
    it cannot be combined with, checked before anything is moved.
    """


@hookspec
def omni_register_executors(registry: ExecutorRegistrar) -> None:
    """Register places a pipeline stage can run, beyond the core's own ``process`` (a spawned
    process) and ``inprocess`` (a thread of the orchestrator's process). Plugin API 1.2.

    ``ref`` is an :class:`omni_core.pipeline.executor.StageExecutor` subclass; a recipe selects
    it per stage by name (``pipeline.stages.<stage>.placement: ray``). The orchestrator builds
    one instance per pipeline with the recipe's ``pipeline.executors.<name>`` options and asks
    it to launch each stage placed on it; the stage speaks the same messages and uses the same
    connectors wherever it runs. ``process`` and ``inprocess`` are reserved names.
    """


@hookspec
def omni_register_stage_engines(registry: StageEngineRegistrar) -> None:
    """Register engines that run other plugins' pipeline stages (vLLM for autoregressive
    stages, ...). Plugin API 1.3.

    ``ref`` is an :class:`omni_core.pipeline.stage.StageEngine` subclass, built in the stage's
    process as ``cls(model_dir, stage, options)`` like a model's own engine; it reads
    ``stage.architecture`` to know what to load. ``stage_kinds`` and ``architectures`` say
    which stages it can run; ``probe`` (``module:function(architecture)`` returning a
    :class:`omni_core.platforms.ProbeResult` or a bool, import-light) says whether it can here.
    When the pipeline is resolved, each stage with an ``architecture`` runs on the
    highest-``priority`` engine that claims it and whose probe agrees, else on its model's own
    engine; a recipe's ``pipeline.stages.<stage>.engine`` names one instead, and ``omni
    explain pipeline`` says which ran and why. An optional classmethod
    ``option_problems(options) -> list[str]`` checks the stage's ``engine_options`` before
    any process starts.
    """


@hookspec
def omni_register_cache_backends(registry: CacheBackendRegistrar) -> None:
    """Register diffusion step-caching methods (TeaCache, Cache-DiT, ...). Plugin API 1.4.

    ``ref`` is an :class:`omni_core.cache.CacheBackend` subclass. The contract for the runtime
    that applies them: at most one is active per model, chosen when the model is opened
    (``--cache-backend``, a recipe's ``cache``); ``incompatible_with`` lists the features it
    cannot be combined with (``offload:<name>``, ``attention:<BACKEND>``, ``family:<name>``),
    and the family must declare settings for it (``cache`` of the family, by backend name).
    Both are checked, with the backend's ``option_problems`` and ``declaration_problems``,
    before any hook is installed. The runtime calls ``enable`` once after loading,
    ``refresh(steps, quality)`` before each request, ``report`` after it, and ``disable``
    to restore the model exactly.
    """


@hookspec
def omni_register_commands(registry: CommandRegistrar) -> None:
    """Register ``omni`` CLI commands.

    ``ref`` is a Typer app (added as a command group) or a function (added as a command);
    ``help`` is the one-line summary shown by ``omni --help``, which reads it from the
    manifest without importing the plugin.
    """


@hookspec
def omni_configure(config: OmniConfig) -> None:
    """Called once per process, after every plugin's registration hooks succeeded and before
    names are resolved, with each plugin in turn.

    Receives the resolved :class:`omni_core.runtime_config.OmniConfig` (read it; do not
    register from here). Use it for one-time setup that depends on the final configuration,
    such as logging or warnings. An exception skips the plugin (status ``hook-failed``) like
    any other hook failure, so a plugin whose setup failed contributes nothing.
    """


#: Registration hooks by kind, in the order they are called.
REGISTRATION_HOOKS = (
    "omni_register_platforms",
    "omni_register_attention_backends",
    "omni_register_models",
    "omni_register_tts_adapters",
    "omni_register_connectors",
    "omni_register_offloaders",
    "omni_register_executors",
    "omni_register_stage_engines",
    "omni_register_cache_backends",
    "omni_register_commands",
)
