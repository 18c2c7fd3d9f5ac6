"""`omni explain attention` on this machine: which backend each role gets and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("omni_plugin_cpu", reason="needs the CPU plugin installed (the tox 'core' env has none)")
pytest.importorskip("torch", reason="the CPU plugin's backends need torch")


def omni(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    environ.update(OMNI_CONFIG_DIR=str(tmp_path / "config"), OMNI_CACHE_DIR=str(tmp_path / "cache"), **env)
    return subprocess.run(
        [sys.executable, "-m", "omni_cli.main", "explain", "attention", *args],
        capture_output=True,
        text=True,
        env=environ,
        check=False,
    )


def test_automatic_choice_per_role_on_the_cpu(tmp_path):
    result = omni(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["platform"] == "cpu"
    assert [r["subject"] for r in data["roles"]] == [
        "attention for role 'self' on cpu",
        "attention for role 'cross' on cpu",
    ]
    for role in data["roles"]:
        assert role["winner"] == "TORCH_SDPA" and role["rule"].startswith("defaulting to TORCH_SDPA")
        outcomes = {c["name"]: c["outcome"] for c in role["candidates"]}
        assert outcomes["REFERENCE_ATTN"] == outcomes["CHUNKED_ATTN"] == "not-considered"
    backends = {b["name"]: b for b in data["backends"]}
    assert backends["TORCH_SDPA"]["available"] and backends["CHUNKED_ATTN"]["available"]


def test_per_role_config_and_the_global_shorthand(tmp_path):
    config = json.dumps({"per_role": {"cross": {"backend": "chunked_attn"}}})
    result = omni(tmp_path, "--config", config, "--role", "video.self:self", "--role", "text.cross:cross")
    assert result.returncode == 0, result.stderr
    assert "=> TORCH_SDPA (defaulting to TORCH_SDPA" in result.stdout
    assert "=> CHUNKED_ATTN (explicit choice in per_role['cross'])" in result.stdout
    shorthand = omni(tmp_path, "--json", OMNI_ATTENTION_BACKEND="reference_attn")
    assert {r["winner"] for r in json.loads(shorthand.stdout)["roles"]} == {"REFERENCE_ATTN"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--attention-backend", "FLASH_ATTN"), "attention backend FLASH_ATTN was chosen explicitly for role 'self'"),
        (("--attention-backend", "NO_SUCH_ATTN"), "not installed: no active plugin provides it"),
        (("--config", "{bad json"), "attention config is not valid JSON"),
        (
            ("--config", '{"default": {"backend": "TORCH_SDPA", "quant": {"dtype_qk": "int8"}}}'),
            "TORCH_SDPA does not support option block(s) ['quant']",
        ),
        (("--config", '{"default": {"backend": "X"}}', "--attention-backend", "Y"), "given twice"),
    ],
)
def test_impossible_choices_fail_with_the_reason(tmp_path, args, message):
    result = omni(tmp_path, *args)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
