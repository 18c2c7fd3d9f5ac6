"""Settings come from environment variables over the persistent user config."""

from __future__ import annotations

import pytest

from omni_core.config import Settings, UserConfig, normalize_dist
from omni_core.errors import ConfigError
from omni_core.kinds import Kind


def test_environment_lists_are_parsed_per_kind(tmp_path):
    env = {
        "OMNI_CONFIG_DIR": str(tmp_path),
        "OMNI_PLUGINS": "a, B",
        "OMNI_DISABLE_PLUGINS": "c",
        "OMNI_MODELS": "flux,SD3",
        "OMNI_DISABLE_ATTENTION_BACKENDS": "FLASH_ATTN",
        "OMNI_STRICT_PLUGINS": "yes",
        "OMNI_PLATFORM": "cuda",
    }
    s = Settings.from_env(env)
    assert s.allow_plugins == {"a", "b"} and s.deny_plugins == {"c"}
    assert s.allow_by_kind == {Kind.MODEL: {"flux", "sd3"}}
    assert s.deny_by_kind == {Kind.ATTENTION_BACKEND: {"flash_attn"}}
    assert s.strict and not s.safe_mode and s.platform == "cuda"


def test_user_config_round_trips_and_feeds_settings(tmp_path):
    config = UserConfig.load(tmp_path / "config.toml")
    config.disabled = ["broken"]
    config.pins = {"attention_backend": {"FLASH_ATTN": "Omni_Plugin.ROCm"}}
    config.platform = "rocm"
    config.save()
    again = UserConfig.load(tmp_path / "config.toml")
    assert again.disabled == ["broken"] and again.platform == "rocm"
    s = Settings.from_env({"OMNI_CONFIG_DIR": str(tmp_path)})
    assert "broken" in s.deny_plugins and s.platform == "rocm"
    assert s.pins == {(Kind.ATTENTION_BACKEND, "flash_attn"): "omni-plugin-rocm"}
    # the environment beats the file
    assert Settings.from_env({"OMNI_CONFIG_DIR": str(tmp_path), "OMNI_PLATFORM": "cpu"}).platform == "cpu"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("plugins = [", "config.toml"),
        ("[plugins]\ndisabled = 'x'", "must be a list"),
        ("[pins.gadget]\nX = 'y'", "unknown extension kind"),
        ("platform = 3", "platform must be a string"),
        ("disabled = ['x']", r"unknown key\(s\) \['disabled'\]"),
    ],
)
def test_bad_config_files_name_the_problem(tmp_path, text, message):
    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({"OMNI_CONFIG_DIR": str(tmp_path)})


def test_distribution_names_are_normalised():
    assert normalize_dist("Omni_Plugin.CPU") == normalize_dist("omni-plugin-cpu") == "omni-plugin-cpu"


def test_kind_parse_accepts_dashes_and_plurals():
    assert Kind.parse("attention-backends") is Kind.ATTENTION_BACKEND
    assert Kind.MODEL.allow_env == "OMNI_MODELS" and Kind.TTS_ADAPTER.deny_env == "OMNI_DISABLE_TTS_ADAPTERS"
    with pytest.raises(ValueError, match="known kinds"):
        Kind.parse("widgets")
