"""Registers exactly what ``omni_plugin.toml`` declares: the manifest is the one source of this
plugin's names and fields, and the core sets the class's identity from it."""

from omni_core.declared import *  # noqa: F403
