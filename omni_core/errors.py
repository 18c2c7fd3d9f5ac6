"""Errors raised by the core. Each message names the problem and the fix."""

from __future__ import annotations


class OmniError(Exception):
    """Base class of every error the core raises on purpose."""


class ManifestError(OmniError):
    """A plugin's declared metadata (``omni_plugin.toml``) is missing or malformed."""


class ReferenceFormatError(OmniError, ValueError):
    """A lazy reference is not of the form ``package.module:attribute``."""


class LazyImportError(OmniError, ImportError):
    """Resolving a lazy reference failed: its module did not import or lacks the attribute."""


class RegistrationError(OmniError):
    """A plugin registered something invalid from one of its hooks."""


class UnknownExtensionError(OmniError, LookupError):
    """A name was looked up that no active plugin provides."""


class ConflictError(OmniError):
    """Two plugins provide the same name at the same priority and no pin decides between them."""


class PluginLoadError(OmniError):
    """Raised in strict mode (``OMNI_STRICT_PLUGINS=1``) when any plugin has a problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"{len(problems)} plugin problem(s) with OMNI_STRICT_PLUGINS=1:\n{lines}\n"
            "Fix or uninstall the plugins named above, or unset OMNI_STRICT_PLUGINS to skip them."
        )


class PlatformSelectionError(OmniError):
    """No platform, or more than one, could be chosen for this machine."""


class ConfigError(OmniError, ValueError):
    """The user configuration file or an environment variable holds an invalid value."""


class PluginExitError(OmniError):
    """Plugin code raised ``SystemExit``, or ``KeyboardInterrupt`` with no Ctrl-C from the user.

    omni turns either into an ordinary failure of that plugin (see :mod:`omni_core.guard`), so
    a plugin cannot end a command or a server; the user's own Ctrl-C still stops omni.
    """


class OutputError(OmniError, ValueError):
    """Outputs cannot be written as asked: a format the model cannot produce, a ``--format``
    that contradicts the file name, or a name that would overwrite a file nobody asked for."""


class ModelLoadError(OmniError):
    """A checkpoint could not be loaded (truncated or corrupt weights, a missing component, a
    runtime forced onto a checkpoint it cannot read): the message names the directory, the
    cause and the fix. Runtimes (the diffusion runtime, TTS adapters) raise it when loading fails."""


class CheckpointFormatError(ModelLoadError, ValueError):
    """A file of a checkpoint (``config.json``, ``model_index.json``, a component's config, a
    weights header) is present but malformed: named as malformed, with its path, never as missing."""


class ModelRuntimeError(OmniError):
    """A loaded model failed while generating: the message names the model and suggests a fix.
    The original exception is chained (``OMNI_DEBUG=1`` shows its traceback)."""
