"""omni's ``mooncake`` connector: stage payloads through Mooncake's transfer engine.

* :class:`omni_plugin_mooncake.connector.MooncakeConnector`: each process owns a
  ``mooncake.engine.TransferEngine`` and (once it puts) a registered staging pool; consumers
  read payloads out of the producer's pool with one transfer each.

Nothing is imported here: omni imports this package whenever it loads plugins, and Mooncake
only when the connector is built.
"""
