"""omni's ``tcp`` connector: stage payloads over ZeroMQ, between processes and machines.

* :class:`omni_plugin_zmq.connector.TcpConnector`: every process that puts serves its outbox
  on a ZeroMQ ROUTER socket; a consumer pulls each payload once with a DEALER socket. Small
  payloads travel inline in the handle.

Nothing is imported here: omni imports this package whenever it loads plugins, and pyzmq only
when the connector is used.
"""
