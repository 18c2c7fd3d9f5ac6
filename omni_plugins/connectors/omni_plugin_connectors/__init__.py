"""omni's stage-to-stage transports (connectors): ``inprocess`` and ``shm``.

Each module imports nothing heavy: the payload codec loads numpy or torch only when a payload
holds them. The registry loads the classes by the references in ``omni_plugin.toml``.
"""
