"""The resolved configuration handed to plugins through ``omni_configure``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class OmniConfig(BaseModel):
    """Resolved, transport-safe configuration (no process-local objects), read-only."""

    model_config = ConfigDict(frozen=True)

    strict: bool = False
    safe_mode: bool = False
    #: forced platform name, if any (``OMNI_PLATFORM`` or the user config)
    platform: str | None = None
    #: names of the plugins that loaded
    plugins: tuple[str, ...] = ()
