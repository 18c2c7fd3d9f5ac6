"""The CPU platform answers about this machine without any vendor SDK."""

from omni_plugin_cpu.platform import CpuPlatform, probe


def test_probe_always_claims_and_says_why():
    result = probe()
    assert result.claims is True
    assert "CPU" in result.reason


def test_platform_answers_about_the_machine():
    platform = CpuPlatform()
    assert platform.device_type == "cpu" and platform.device_count() == 1
    mem = platform.memory_info()
    assert 0 < mem.free_bytes <= mem.total_bytes
    assert "float32" in platform.supported_dtypes()
    assert platform.default_attention_chain() == ("TORCH_SDPA",)
    assert platform.compute_capability() is None
    assert platform.supports_offload is True  # runs there (saves nothing): recipes naming offload work
    facts = platform.facts()
    assert facts["platform"] == "cpu" and facts["logical_cpus"] >= 1


def test_seeding_makes_random_draws_repeat():
    import torch

    platform = CpuPlatform()
    platform.seed_everything(123)
    a = torch.randn(4)
    platform.seed_everything(123)
    assert torch.equal(a, torch.randn(4))
    assert str(platform.device(3)) == "cpu"
