"""omni core: the plugin contract, discovery, typed registries and explainable selection.

``import omni_core`` is cheap and never imports torch, vllm, diffusers or a web framework.

* :mod:`omni_core.hookspecs` - the hooks a plugin implements (the contract, documented)
* :mod:`omni_core.manifest` - the ``omni_plugin.toml`` every plugin ships
* :mod:`omni_core.discovery` - finding plugins without importing them
* :mod:`omni_core.plugins` - loading them in isolation into typed registries
* :mod:`omni_core.platforms`, :mod:`omni_core.attention` - base classes for those kinds
* :mod:`omni_core.testing` - the conformance kit for plugin authors
* :class:`omni_core.Omni` - the offline API: open a model directory and use it
"""

from typing import TYPE_CHECKING

from omni_core._version import PLUGIN_API_VERSION, __version__
from omni_core.kinds import Kind

if TYPE_CHECKING:
    from omni_core.api import Omni
    from omni_core.hookspecs import hookimpl

__all__ = ["PLUGIN_API_VERSION", "Kind", "Omni", "__version__", "hookimpl"]


def __getattr__(name: str) -> object:
    # ``hookimpl`` needs pluggy, which the metadata-only paths (``omni --help``,
    # ``omni plugins list``) never use: import it on first access only.
    if name == "hookimpl":
        from omni_core.hookspecs import hookimpl

        return hookimpl
    if name == "Omni":
        # the offline API pulls in the runtimes it opens only when a model is opened
        from omni_core.api import Omni

        return Omni
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
