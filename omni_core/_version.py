"""Versions of the omni core.

The package version moves with every release; the plugin API version moves only when the
contract in :mod:`omni_core.hookspecs` (or the registrar and base-class signatures it names)
changes. Plugins declare the API range they support, never a core package version.

What changed, by plugin API version (docs/authoring/index.md, "Plugin API versions", says the same):

* **1.4** - a new kind, ``cache_backend`` (``omni_register_cache_backends``,
  ``[[cache_backend]]`` in the manifest, :mod:`omni_core.cache`): diffusion step caching, one
  backend per model, checked against the family's declaration for it before any hook. TTS
  adapters gain three optional classmethods: ``identify`` (claim a model that
  has no ``config.json``, e.g. a Piper voice file pair), ``installed_models`` (models
  installed as packages, by short name) and ``ready_model`` (a real model offered as omni's
  default voice). A plugin that declares a cache backend, or an adapter that relies on the
  classmethods, declares ``omni_api = ">=1.4,<2"``.
  Nothing else changed.
* **1.3** - a new kind, ``stage_engine`` (``omni_register_stage_engines``, ``[[stage_engine]]``
  in the manifest): an engine that runs other plugins' pipeline stages (vLLM for autoregressive
  stages), chosen per stage by the stage's ``kind`` and ``architecture`` (new optional
  ``StageDef`` fields, with ``engine_name``). A plugin that declares stage engines declares
  ``omni_api = ">=1.3,<2"``. Nothing else changed.
* **1.2** - multi-stage pipelines: a connector is a :class:`omni_core.pipeline.connector.Connector`
  subclass built as ``cls(extra, context)`` (1.1 named a constructor taking ``extra``), and a new
  kind, ``executor`` (``omni_register_executors``, ``[[executor]]`` in the manifest), places
  stages beyond the core's own processes and threads. A plugin that declares executors, or
  whose connector follows the new contract, declares ``omni_api = ">=1.2,<2"``. Nothing else
  changed: 1.1 and 1.0 plugins of the other kinds keep working unchanged.
* **1.1** - a plugin whose registrations are static declares them once, in
  ``omni_plugin.toml``; its hook module is ``from omni_core.declared import *`` (hooks that
  register exactly what the manifest declares, via ``Registrar.register_declared()``). Such a
  plugin declares ``omni_api = ">=1.1,<2"``. The identity class attributes (``name``,
  ``stage_keys``, ``model_archs``, ``detect_priority``, ``device_types``) are set on the classes
  from the registration (:mod:`omni_core.identity`); a class that states one differently fails to
  load with ``DeclarationMismatchError``. ``PluginRecord`` has ``notes`` and ``traceback`` beside
  ``warnings``. Nothing was removed: 1.0 plugins (hand-written hooks plus a manifest, class
  attributes that agree with it) keep working unchanged.
* **1.0** - the first contract: entry point ``omni.plugins``, ``omni_plugin.toml``, the
  ``omni_register_*`` hooks with typed registrars, ``omni_configure``.
"""

__version__ = "0.1.0"

#: The version of the plugin contract. Minor bumps add hooks or optional fields (old plugins
#: keep working); a major bump breaks compatibility.
PLUGIN_API_VERSION = "1.4"
