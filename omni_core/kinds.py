"""The extension kinds a plugin can contribute, with the names derived from each."""

from __future__ import annotations

import enum


class Kind(enum.StrEnum):
    """One kind of extension. The value is the key used in manifests and config files."""

    PLATFORM = "platform"
    ATTENTION_BACKEND = "attention_backend"
    MODEL = "model"
    TTS_ADAPTER = "tts_adapter"
    CONNECTOR = "connector"
    OFFLOADER = "offloader"
    EXECUTOR = "executor"
    STAGE_ENGINE = "stage_engine"
    CACHE_BACKEND = "cache_backend"
    COMMAND = "command"

    def __str__(self) -> str:
        return self.value

    @property
    def plural(self) -> str:
        """``attention_backends``: used in hook names and environment variables."""
        return self.value + "s"

    @property
    def hook_name(self) -> str:
        """The hook a plugin implements to register this kind, e.g. ``omni_register_models``."""
        return f"omni_register_{self.plural}"

    @property
    def allow_env(self) -> str:
        """Allow-list variable for this kind, e.g. ``OMNI_MODELS=flux,sd3``."""
        return "OMNI_" + self.plural.upper()

    @property
    def deny_env(self) -> str:
        """Deny-list variable for this kind, e.g. ``OMNI_DISABLE_MODELS=flux``."""
        return "OMNI_DISABLE_" + self.plural.upper()

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")

    @classmethod
    def parse(cls, text: str) -> Kind:
        """Accept ``attention-backend``, ``attention_backend`` or ``attention_backends``."""
        key = text.strip().lower().replace("-", "_")
        for kind in cls:
            if key in (kind.value, kind.plural):
                return kind
        known = ", ".join(k.value for k in cls)
        raise ValueError(f"unknown extension kind {text!r}; known kinds: {known}")
