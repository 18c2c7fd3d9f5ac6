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
