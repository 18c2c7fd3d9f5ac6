"""The ``omni`` command line."""

from omni_core import __version__

__all__ = ["__version__"]
