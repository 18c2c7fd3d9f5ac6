"""Hook implementations: register names and lazy references only, never import torch here."""

from omni_core import hookimpl


@hookimpl
def omni_register_platforms(registry):  # type: ignore[no-untyped-def]
    # Lowest priority: the CPU is always there, so any vendor platform that claims wins.
    registry.register(
        "cpu",
        "omni_plugin_cpu.platform:CpuPlatform",
        probe="omni_plugin_cpu.platform:probe",
        priority=-100,
    )


@hookimpl
def omni_register_attention_backends(registry):  # type: ignore[no-untyped-def]
    registry.register("TORCH_SDPA", "omni_plugin_cpu.attention:TorchSDPABackend")
    # Explicit only: no platform lists them in its default chain.
    registry.register("REFERENCE_ATTN", "omni_plugin_cpu.reference:ReferenceBackend")
    registry.register("CHUNKED_ATTN", "omni_plugin_cpu.chunked:ChunkedBackend")
