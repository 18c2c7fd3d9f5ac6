"""Registers exactly what ``omni_plugin.toml`` declares (plugin API 1.1): the manifest is the one
source of this plugin's names and fields, and the core sets the classes' identity from it."""

from omni_core.declared import *  # noqa: F403
