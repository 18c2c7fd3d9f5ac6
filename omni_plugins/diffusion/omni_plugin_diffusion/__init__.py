"""omni's shared diffusion runtime (see :mod:`omni_plugin_diffusion.family`)."""

from omni_plugin_diffusion.family import DiffusersFamily

__all__ = ["DiffusersFamily"]
