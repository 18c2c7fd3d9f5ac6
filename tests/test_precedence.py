"""One precedence, the same on the command line and in the offline API, for every setting with
more than one source: explicit choices (flags, ``Omni(...)`` arguments) > the recipe > the
environment > the config file > defaults. The CLI hands its flags to the core as objects and
writes nothing into ``os.environ``.

Command-line checks run the real ``omni`` of this environment (with torch and the FLUX family)
in a private home; API checks run in-process on the same tiny checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from omni_core.config import EngineSettings, Overrides, Settings

OMNI = Path(sys.executable).parent / "omni"
HAS_FLUX = importlib.util.find_spec("omni_plugin_flux") is not None and importlib.util.find_spec("torch") is not None
needs_flux = pytest.mark.skipif(not HAS_FLUX, reason="torch and the flux plugin (omni_plugins/flux) are not installed")

#: three backends the CPU platform runs, one per layer: flag, recipe, environment
FLAG, RECIPE, ENV = "TORCH_SDPA", "REFERENCE_ATTN", "CHUNKED_ATTN"
ROLES = ("flux.joint", "flux.single")


def private_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    return {**env, "OMNI_CONFIG_DIR": str(home / "config"), "OMNI_CACHE_DIR": str(home / "cache"), **extra}


def omni(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(OMNI), *args], capture_output=True, text=True, env=private_env(home, **extra), cwd=home, timeout=600
    )


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("precedence-home")


@pytest.fixture(scope="module")
def tiny(home: Path) -> Path:
    if not HAS_FLUX:
        pytest.skip("torch and the flux plugin are not installed")
    ok(omni(home, "models", "make-tiny", "flux1-schnell", str(home / "flux")))
    return home / "flux"


@pytest.fixture(scope="module")
def recipe(home: Path) -> Path:
    """A recipe that sets every engine setting a layer below the flags can set."""
    path = home / "recipe.yaml"
    path.write_text(f"attention:\n  default: {{backend: {RECIPE}}}\noffload: [layerwise]\ndtype: bfloat16\n")
    return path


# -- attention backend, offload, dtype: the command line --------------------------------------


def _plan(home: Path, tiny: Path, *args: str, **env: str) -> dict[str, Any]:
    proc = ok(omni(home, "explain", "model", "--model", str(tiny), "--json", *args, **env))
    selections: dict[str, Any] = json.loads(proc.stdout)["selections"]
    return selections


@needs_flux
@pytest.mark.parametrize(
    ("env", "use_recipe", "flag", "expected"),
    [
        ({}, False, None, "TORCH_SDPA"),  # the platform's default chain
        ({"OMNI_ATTENTION_BACKEND": ENV}, False, None, ENV),  # environment > default
        ({"OMNI_ATTENTION_BACKEND": ENV}, True, None, RECIPE),  # recipe > environment
        ({"OMNI_ATTENTION_BACKEND": ENV}, True, FLAG, FLAG),  # flag > recipe
    ],
    ids=["default", "env", "recipe-beats-env", "flag-beats-recipe"],
)
def test_cli_attention_backend(home: Path, tiny: Path, recipe: Path, env: dict[str, str], use_recipe: bool,
                               flag: str | None, expected: str) -> None:  # fmt: skip
    args = [*(["--recipe", str(recipe)] if use_recipe else []), *(["--attention-backend", flag] if flag else [])]
    plan = _plan(home, tiny, *args, **env)
    assert {role: plan[f"attention:{role}"]["winner"] for role in ROLES} == dict.fromkeys(ROLES, expected)


@needs_flux
def test_cli_explain_attention_flag_beats_environment(home: Path) -> None:
    def winner(*args: str, **env: str) -> str:
        proc = ok(omni(home, "explain", "attention", "--role", "self", "--json", *args, **env))
        return str(json.loads(proc.stdout)["roles"][0]["winner"])

    assert winner() == "TORCH_SDPA"
    assert winner(OMNI_ATTENTION_BACKEND=ENV) == ENV
    assert winner("--attention-backend", RECIPE, OMNI_ATTENTION_BACKEND=ENV) == RECIPE


@needs_flux
def test_cli_offload_flag_beats_recipe(home: Path, tiny: Path, recipe: Path) -> None:
    assert _plan(home, tiny)["offload"]["winner"] is None
    assert _plan(home, tiny, "--recipe", str(recipe))["offload"]["winner"] == "layerwise"
    assert _plan(home, tiny, "--recipe", str(recipe), "--offload", "model_cpu")["offload"]["winner"] == "model_cpu"


@needs_flux
def test_cli_cache_backend_flag_beats_recipe_beats_environment(home: Path, tiny: Path) -> None:
    recipe = home / "cache.yaml"
    recipe.write_text("cache: {backend: teacache, config: {rel_l1_thresh: 0.3}}\n")

    def winner(*args: str, **env: str) -> str | None:
        selection = _plan(home, tiny, *args, **env)["cache"]
        return None if selection["winner"] is None else str(selection["winner"])

    assert winner() is None  # nothing cached unless asked
    assert winner(OMNI_CACHE_BACKEND="cache_dit") == "cache_dit"
    assert winner("--recipe", str(recipe), OMNI_CACHE_BACKEND="cache_dit") == "teacache"
    assert winner("--recipe", str(recipe), "--cache-backend", "cache_dit") == "cache_dit"
    assert winner("--recipe", str(recipe), "--cache-backend", "none") is None


@needs_flux
def test_cli_generate_runs_what_the_precedence_chose(home: Path, tiny: Path) -> None:
    """``omni generate`` itself: attention and dtype from the recipe beat the environment, and
    the flags beat the recipe (``--attention-backend`` once read OMNI_ATTENTION_BACKEND as if it
    were the flag, so the environment beat the recipe on the command line but not in Python)."""
    recipe = home / "attention-dtype.yaml"
    recipe.write_text(f"attention:\n  default: {{backend: {RECIPE}}}\ndtype: bfloat16\n")
    common = ["generate", "a fox", "--model", str(tiny), "--steps", "1", "--width", "32", "--height", "32"]
    common += ["--seed", "0", "--no-progress", "--recipe", str(recipe)]
    by_recipe = ok(omni(home, *common, "--out", "a.png", OMNI_ATTENTION_BACKEND=ENV)).stdout
    assert f"flux.joint: {RECIPE}, flux.single: {RECIPE}" in by_recipe and "(bfloat16)" in by_recipe
    flags = ["--attention-backend", FLAG, "--dtype", "float32", "--out", "b.png"]
    by_flags = ok(omni(home, *common, *flags, OMNI_ATTENTION_BACKEND=ENV)).stdout
    assert f"flux.joint: {FLAG}, flux.single: {FLAG}" in by_flags and "(float32)" in by_flags


# -- platform, safe mode, strict mode: the command line ---------------------------------------


@needs_flux
def test_cli_platform_flag_beats_environment_beats_config_file(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text('platform = "cuda"\n')  # no NVIDIA GPU here
    forced = omni(tmp_path, "explain", "platform", "--json")
    assert forced.returncode == 1 and json.loads(forced.stdout)["winner"] is None  # the config file counts
    by_env = ok(omni(tmp_path, "explain", "platform", "--json", OMNI_PLATFORM="cpu"))
    assert json.loads(by_env.stdout)["winner"] == "cpu"  # environment > config file
    by_flag = ok(omni(tmp_path, "explain", "attention", "--platform", "cuda", "--json", OMNI_PLATFORM="cpu"))
    assert json.loads(by_flag.stdout)["platform"] == "cuda"  # flag > environment


@needs_flux
@pytest.mark.parametrize(
    ("setting", "variable", "flag"),
    [("safe_mode", "OMNI_SAFE_MODE", "safe-mode"), ("strict", "OMNI_STRICT_PLUGINS", "strict")],
)
def test_cli_switch_flags_beat_the_environment(home: Path, setting: str, variable: str, flag: str) -> None:
    def listed(*args: str, **env: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(ok(omni(home, *args, "plugins", "list", "--json", **env)).stdout)
        return data

    assert listed()[setting] is False
    assert listed(**{variable: "1"})[setting] is True
    assert listed(f"--no-{flag}", **{variable: "1"})[setting] is False
    assert listed(f"--{flag}", **{variable: "0"})[setting] is True
    if setting == "safe_mode":  # and it takes effect: third-party plugins come back
        names = {p["name"] for p in listed("--no-safe-mode", OMNI_SAFE_MODE="1")["plugins"]}
        assert {"cpu", "flux"} <= names
        assert {p["name"] for p in listed(OMNI_SAFE_MODE="1")["plugins"]} == {"cpu"}


def test_cli_flags_are_not_written_into_the_environment(tmp_path: Path) -> None:
    """The flags reach the core as an object; os.environ (what child processes inherit) is untouched."""
    script = (
        "import json, os\n"
        "from omni_cli.main import _early_root_flags, _invoke\n"
        "from omni_core.config import current_settings\n"
        # a command that needs no plugin, so this runs in the torch-free core environment too
        "argv = ['--strict', '--safe-mode', 'plugins', 'list', '--json']\n"
        "_early_root_flags(argv)\n"
        "code = _invoke(argv)\n"
        "s = current_settings()\n"
        "env = sorted(k for k in os.environ if k.startswith('OMNI_'))\n"
        "print('RESULT', json.dumps([code, s.strict, s.safe_mode, env]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=private_env(tmp_path), timeout=300
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    code, strict, safe_mode, env = json.loads(line.removeprefix("RESULT "))
    assert (code, strict, safe_mode) == (0, True, True), proc.stderr
    assert env == ["OMNI_CACHE_DIR", "OMNI_CONFIG_DIR"]


def test_only_the_config_module_reads_the_environment() -> None:
    """One reader: outside ``omni_core/config.py`` neither the core nor the CLI reads or writes
    ``os.environ`` or lets click read a variable for an option (``envvar=``). The conformance
    kit (``omni_core/testing``) builds environments for the processes it starts, as tests do."""
    root = Path(__file__).resolve().parent.parent
    files = [*(root / "omni_core").rglob("*.py"), *(root / "cli" / "omni_cli").rglob("*.py")]
    exempt = {root / "omni_core" / "config.py", *(root / "omni_core" / "testing").rglob("*.py")}
    reads = re.compile(r"\bos\.(environ|getenv|putenv|unsetenv)\b|\benvvar=")
    readers = [
        f"{f.relative_to(root)}:{n}: {line.strip()}"
        for f in files
        if f not in exempt
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if reads.search(line.split("#")[0])  # comments may name os.environ
    ]
    assert not readers, "environment read outside omni_core/config.py:\n" + "\n".join(readers)


# -- the offline API: the same order, in-process ----------------------------------------------


@pytest.mark.parametrize(
    ("environ", "overrides", "expected"),
    [
        ({}, Overrides(), (False, False, None)),
        ({"OMNI_STRICT_PLUGINS": "1", "OMNI_SAFE_MODE": "1", "OMNI_PLATFORM": "cpu"}, Overrides(), (True, True, "cpu")),
        (
            {"OMNI_STRICT_PLUGINS": "1", "OMNI_SAFE_MODE": "1", "OMNI_PLATFORM": "cpu"},
            Overrides(strict=False, safe_mode=False, platform="xpu"),
            (False, False, "xpu"),
        ),
        ({}, Overrides(strict=True, safe_mode=True), (True, True, None)),
    ],
    ids=["defaults", "environment", "explicit-beats-environment", "explicit"],
)
def test_api_settings(tmp_path: Path, environ: dict[str, str], overrides: Overrides, expected: tuple[Any, ...]) -> None:
    env = {"OMNI_CONFIG_DIR": str(tmp_path), **environ}
    settings = Settings.from_env(env, overrides=overrides)
    assert (settings.strict, settings.safe_mode, settings.platform) == expected


def test_api_platform_environment_beats_config_file(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('platform = "npu"\n')
    assert Settings.from_env({"OMNI_CONFIG_DIR": str(tmp_path)}).platform == "npu"
    assert Settings.from_env({"OMNI_CONFIG_DIR": str(tmp_path), "OMNI_PLATFORM": "cpu"}).platform == "cpu"
    environ = {"OMNI_CONFIG_DIR": str(tmp_path), "OMNI_PLATFORM": "cpu"}
    assert Settings.from_env(environ, overrides=Overrides(platform="xpu")).platform == "xpu"


def test_engine_settings_read_the_environment() -> None:
    assert EngineSettings.from_env({}).attention_backend is None
    assert EngineSettings.from_env({"OMNI_ATTENTION_BACKEND": " chunked_attn "}).attention_backend == "chunked_attn"
    assert EngineSettings.from_env({}).cache_backend is None
    assert EngineSettings.from_env({"OMNI_CACHE_BACKEND": " teacache "}).cache_backend == "teacache"


@pytest.fixture(scope="module")
def api(home: Path, tiny: Path) -> tuple[Any, Any]:
    """The plugins of this environment, loaded in-process with the private home, and the
    tiny checkpoint's resolution."""
    from omni_core.generation.resolve import resolve_model
    from omni_core.plugins import load_plugins

    plugins = load_plugins(Settings.from_env(private_env(home)))
    return plugins, resolve_model(plugins, tiny)


@needs_flux
@pytest.mark.parametrize(
    ("env", "use_recipe", "given", "expected"),
    [
        (None, False, {}, (None, (), None)),  # None: the platform's chain and the family's dtype decide later
        (ENV, False, {}, (ENV, (), None)),
        (ENV, True, {}, (RECIPE, ("layerwise",), "bfloat16")),
        (
            ENV,
            True,
            {"attention_backend": FLAG, "offload": "model_cpu", "dtype": "float32"},
            (FLAG, ("model_cpu",), "float32"),
        ),
    ],
    ids=["default", "env", "recipe-beats-env", "arguments-beat-recipe"],
)
def test_api_engine_options(api: tuple[Any, Any], recipe: Path, env: str | None, use_recipe: bool,
                            given: dict[str, Any], expected: tuple[Any, ...]) -> None:  # fmt: skip
    from omni_core.generation.model import EngineOptions
    from omni_core.generation.recipe import load_recipe

    plugins, resolution = api
    loaded = load_recipe(recipe) if use_recipe else None
    options = EngineOptions.build(resolution, plugins, loaded, given, EngineSettings(attention_backend=env))
    assert (options.attention.default.backend, options.offload, options.dtype) == expected


@needs_flux
def test_api_omni_runs_what_the_precedence_chose(
    api: tuple[Any, Any], home: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Omni(...)`` reads OMNI_ATTENTION_BACKEND (a true boundary: the process environment)
    below the recipe and above the platform default, like the command line."""
    from omni_core import Omni

    plugins, _ = api
    recipe = home / "attention-only.yaml"
    recipe.write_text(f"attention:\n  default: {{backend: {RECIPE}}}\n")

    def chosen(**kwargs: Any) -> dict[str, str]:
        with Omni(tiny, plugins=plugins, progress=False, **kwargs) as model:
            plans = model.explain_all()
        return {role: str(plans[f"attention:{role}"].winner) for role in ROLES}

    monkeypatch.setenv("OMNI_ATTENTION_BACKEND", ENV)
    assert chosen() == dict.fromkeys(ROLES, ENV)
    assert chosen(recipe=recipe) == dict.fromkeys(ROLES, RECIPE)
    assert chosen(recipe=recipe, attention_backend=FLAG) == dict.fromkeys(ROLES, FLAG)
