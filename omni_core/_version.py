"""Versions of the omni core.

The package version moves with every release; the plugin API version moves only when the
contract in :mod:`omni_core.hookspecs` (or the registrar and base-class signatures it names)
changes. Plugins declare the API range they support, never a core package version.
"""

__version__ = "0.1.0"

#: The version of the plugin contract. Minor bumps add hooks or optional fields (old plugins
#: keep working); a major bump breaks compatibility.
PLUGIN_API_VERSION = "1.0"
