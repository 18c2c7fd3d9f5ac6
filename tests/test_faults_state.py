"""The fault battery, state part (issue 9, "State survives corruption and concurrency").

Every row runs the real ``omni`` of the dev environment (this interpreter's) in a private
config and cache home, with the ``omni-fixture-state`` plugin pip-installed for real into a
private site directory where a row needs it, and checks the exit code, a message naming the
cause, no traceback, and that no file was lost or half-written (:mod:`faults`). Rows that
draw or speak with the embedded defaults need torch and the flux / vits plugins.

What the rows pin down:

* a corrupt or wrong-shaped ``config.toml`` is a ConfigError naming the file and the fix,
  in every command, the recovery commands included (they refuse and leave the file alone);
* a corrupt ``plugin-health.json`` or ``manifest-cache.json`` is ignored and rewritten;
* concurrent ``plugins disable``/``enable`` and concurrent first use of an embedded default
  lose nothing and all succeed;
* ``make-tiny`` builds beside the old directory and swaps at the end: a failed or killed
  run leaves the old one, ``--force`` refuses what is not a checkpoint, scratch is swept;
* outputs are written under a temporary name and renamed, derived names never overwrite,
  and the format is checked against ``--out`` before any weight loads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faults import assert_clean_failure, assert_no_traceback, snapshot
from faults import assert_unchanged as _assert_unchanged
from omni_testenv import FIXTURE_PLUGINS, Result

from omni_core.config import Settings, UserConfig
from omni_core.errors import ConfigError, OutputError
from omni_core.fsutil import SCRATCH_PREFIX
from omni_core.generation.outputs import plan_outputs
from omni_core.state import HealthStore

pytestmark = pytest.mark.slow

OMNI = Path(sys.executable).parent / "omni"
FIXTURE = FIXTURE_PLUGINS / "omni-fixture-state"
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_FLUX = HAS_TORCH and importlib.util.find_spec("omni_plugin_flux") is not None
HAS_VITS = HAS_TORCH and importlib.util.find_spec("omni_plugin_vits") is not None
needs_flux = pytest.mark.skipif(not HAS_FLUX, reason="torch and the flux plugin are not installed here")
needs_vits = pytest.mark.skipif(not HAS_VITS, reason="torch and the vits plugin are not installed here")
#: a place no process can create a directory in, root included (sysfs)
UNWRITABLE = Path("/sys/omni-fault-battery")


# --------------------------------------------------------------------------- helpers


def _env(home: Path, site: Path | None, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    env.update(OMNI_CONFIG_DIR=str(home / "config"), OMNI_CACHE_DIR=str(home / "cache"))
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


def _limit_file_size(limit: int | None) -> Callable[[], None] | None:
    """A file size limit for the child: a write past it fails with EFBIG (Python ignores
    SIGXFSZ), a real failure in the middle of writing a file."""
    if limit is None:
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def omni(home: Path, *args: str | Path, site: Path | None = None, fsize: int | None = None, **extra: str) -> Result:
    proc = subprocess.run(
        [str(OMNI), *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(home, site, extra),
        cwd=home,
        timeout=600,
        check=False,
        preexec_fn=_limit_file_size(fsize),
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def start(home: Path, *args: str | Path, site: Path | None = None, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(OMNI), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(home, site, extra),
        cwd=home,
    )


def finish(proc: subprocess.Popen[str]) -> Result:
    out, err = proc.communicate(timeout=600)
    return Result(proc.returncode, out, err)


def ok(result: Result) -> Result:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert_no_traceback(result)
    return result


def scratch_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(SCRATCH_PREFIX))


def assert_unchanged(before: dict[Path, str | None], *roots: Path) -> None:
    _assert_unchanged(before, roots)


def wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"exited {proc.returncode} before the cue:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"no cue at {path} after {seconds} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """omni-fixture-state, pip-installed for real into a directory only these tests use."""
    src = tmp_path_factory.mktemp("state-src") / FIXTURE.name
    shutil.copytree(FIXTURE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("state-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, src],
        check=True,
        capture_output=True,
    )
    return target


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "config").mkdir()
    return tmp_path


@pytest.fixture(scope="module")
def tone_model(tmp_path_factory: pytest.TempPathFactory, site: Path) -> Path:
    """A tiny checkpoint of the fixture's tone TTS family."""
    home = tmp_path_factory.mktemp("tone")
    ok(omni(home, "models", "make-tiny", "fixture-state", home / "tone", site=site))
    return home / "tone"


# --------------------------------------------------------------------------- 1. config.toml

#: (id, what config.toml holds (None: a directory in its place), words the error must contain)
BAD_CONFIGS = [
    ("not-toml", b"plugins = [", "not valid TOML"),
    ("not-utf8", b'platform = "\xff\xfe"\n', "not UTF-8"),
    ("binary-garbage", b"\x00\x01\x02\x89PNG\r\n", "config.toml"),
    ("plugins-is-int", b"plugins = 3\n", "plugins must be a table"),
    ("plugins-unknown-key", b"[plugins]\ndisable = ['x']\n", "unknown key"),
    ("disabled-is-string", b"[plugins]\ndisabled = 'x'\n", "must be a list"),
    ("disabled-has-int", b"[plugins]\ndisabled = ['x', 3]\n", "must be a list"),
    ("pins-is-string", b'pins = "x"\n', "pins must be a table"),
    ("pins-is-list", b"pins = [1]\n", "pins must be a table"),
    ("pin-kind-not-table", b"[pins]\nmodel = 3\n", "[pins.model]"),
    ("pin-value-is-int", b"[pins.model]\nX = 3\n", "[pins.model]"),
    ("pin-kind-unknown", b"[pins.gadget]\nX = 'y'\n", "unknown extension kind"),
    ("platform-is-int", b"platform = 5\n", "platform must be a string"),
    ("unknown-top-key", b"disabled = ['x']\n", "unknown key"),
    ("a-directory", None, "not a file"),
]


def _write_config(home: Path, content: bytes | None) -> Path:
    path = home / "config" / "config.toml"
    if content is None:
        path.mkdir(parents=True)
        (path / "keep").write_text("x")
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize(("content", "words"), [r[1:] for r in BAD_CONFIGS], ids=[r[0] for r in BAD_CONFIGS])
def test_a_bad_config_is_a_config_error_naming_the_file_and_the_fix(home: Path, content: bytes | None, words: str):
    path = _write_config(home, content)
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"OMNI_CONFIG_DIR": str(path.parent)})
    message = str(info.value)
    assert str(path) in message and words in message and "delete it to reset" in message


COMMANDS = [
    ("list", ("plugins", "list")),
    ("disable", ("plugins", "disable", "some-plugin")),
    ("enable", ("plugins", "enable", "some-plugin")),
    ("pin", ("plugins", "pin", "model", "X", "omni-plugin-x")),
    ("doctor", ("doctor",)),
]


@pytest.mark.parametrize(("content", "words"), [r[1:] for r in BAD_CONFIGS], ids=[r[0] for r in BAD_CONFIGS])
@pytest.mark.parametrize("command", [c[1] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_every_command_refuses_a_bad_config_cleanly_and_leaves_it_alone(
    home: Path, content: bytes | None, words: str, command: tuple[str, ...]
):
    path = _write_config(home, content)
    before = snapshot([home / "config"])
    result = omni(home, *command)
    assert_clean_failure(result, 1, str(path), words, "delete it")
    assert_unchanged(before, home / "config")


@pytest.mark.parametrize(
    ("config_dir", "words"),
    [(lambda h: UNWRITABLE, ["permission denied"]), (lambda h: _a_file(h / "f"), ["a file is in the way"])],
    ids=["unwritable", "a-file"],
)
@pytest.mark.parametrize("command", [c[1] for c in COMMANDS[1:4]], ids=[c[0] for c in COMMANDS[1:4]])
def test_saving_the_config_where_it_cannot_be_written_is_a_clear_error(
    home: Path, config_dir: Any, words: list[str], command: tuple[str, ...]
):
    where = config_dir(home)
    result = omni(home, *command, OMNI_CONFIG_DIR=str(where))
    assert_clean_failure(result, 1, str(where / "config.toml"), *words)


def test_recovery_works_once_the_bad_config_is_deleted(home: Path):
    path = _write_config(home, b'pins = "x"\n')
    assert_clean_failure(omni(home, "plugins", "disable", "p"), 1, str(path))
    path.unlink()
    ok(omni(home, "plugins", "disable", "p"))
    assert UserConfig.load(path).disabled == ["p"]


# --------------------------------------------------------------------------- 2. caches

#: (id, bytes written to the cache file): each must be ignored, never a traceback
CORRUPT_CACHES: list[tuple[str, bytes | dict[str, Any]]] = [
    ("garbage", b"\x00\x01garbage{{"),
    ("not-utf8", b'{"a": "\xff\xfe"}'),
    ("json-list", b"[1, 2, 3]"),
    ("json-string", b'"hello"'),
    ("too-deep", b"[" * 100_000),
    (
        "wrong-types",
        {
            "format": 1,
            "manifests": {"/nowhere.toml": [1], "/x.toml": "y"},
            "omni-plugin-cpu==0.1.0/cpu": {"status": 5, "reason": [1], "imports": "abc", "fix": {}},
            "omni-plugin-flux==0.1.0/flux": {"imports": {"omni_plugin_flux.hooks": "slow", "x": None}},
            "x==1/y": [1, 2],
        },
    ),
]
CACHE_FILES = ["plugin-health.json", "manifest-cache.json"]
CACHE_COMMANDS = [("plugins", "list"), ("plugins", "show", "cpu"), ("doctor",), ("plugins", "list", "--load")]


@pytest.fixture(scope="module")
def baseline_codes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], int]:
    """What each command exits with on a clean cache, here (doctor may find real problems)."""
    home = tmp_path_factory.mktemp("baseline")
    return {command: omni(home, *command).returncode for command in CACHE_COMMANDS}


def _corrupt(path: Path, content: bytes | dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())


@pytest.mark.parametrize("content", [c[1] for c in CORRUPT_CACHES], ids=[c[0] for c in CORRUPT_CACHES])
@pytest.mark.parametrize("name", CACHE_FILES)
@pytest.mark.parametrize("command", CACHE_COMMANDS, ids=["-".join(c) for c in CACHE_COMMANDS])
def test_a_corrupt_cache_is_ignored_and_rewritten(
    home: Path, baseline_codes: dict[tuple[str, ...], int], content: Any, name: str, command: tuple[str, ...]
):
    path = home / "cache" / name
    _corrupt(path, content)
    result = omni(home, *command)
    assert result.returncode == baseline_codes[command], result.stdout + result.stderr
    assert_no_traceback(result)
    rewritten = name == "manifest-cache.json" or command in {("doctor",), ("plugins", "list", "--load")}
    if rewritten:  # a command that writes the cache replaced the bad content with a good one
        data = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(data, dict) and data, data
    assert scratch_in(path.parent) == []


def test_health_entries_of_the_wrong_shape_read_as_nothing_remembered(tmp_path: Path):
    _corrupt(tmp_path / "plugin-health.json", dict(CORRUPT_CACHES)["wrong-types"])
    store = HealthStore(tmp_path)
    assert store.lookup("x", "1", "y") is None
    assert store.lookup("omni-plugin-cpu", "0.1.0", "cpu") == {"imports": {}}
    assert store.lookup("omni-plugin-flux", "0.1.0", "flux") == {"imports": {}}
    store.update({("omni-plugin-cpu", "0.1.0", "cpu"): {"status": "ok", "imports": {"m": 0.5}}})
    entry = HealthStore(tmp_path).lookup("omni-plugin-cpu", "0.1.0", "cpu")
    assert entry is not None and entry["status"] == "ok" and entry["imports"] == {"m": 0.5}


# --------------------------------------------------------------------------- 3. concurrent read-modify-write


def test_concurrent_disable_and_enable_lose_no_update(home: Path):
    enabled_later = [f"old-{i}" for i in range(4)]
    path = home / "config" / "config.toml"
    path.write_text(f"[plugins]\ndisabled = {json.dumps(enabled_later)}\n", encoding="utf-8")
    procs = [start(home, "plugins", "enable", name) for name in enabled_later]
    procs += [start(home, "plugins", "disable", f"new-{i}") for i in range(4)]
    for proc in procs:
        ok(finish(proc))
    assert sorted(UserConfig.load(path).disabled) == [f"new-{i}" for i in range(4)]
    assert scratch_in(path.parent) == []


def test_concurrent_pins_lose_no_update(home: Path):
    procs = [start(home, "plugins", "pin", "attention_backend", f"ATTN_{i}", f"omni-plugin-{i}") for i in range(6)]
    for proc in procs:
        ok(finish(proc))
    pins = UserConfig.load(home / "config" / "config.toml").pins["attention_backend"]
    assert pins == {f"ATTN_{i}": f"omni-plugin-{i}" for i in range(6)}


def test_concurrent_health_updates_lose_no_entry(tmp_path: Path):
    code = (
        "import sys; from pathlib import Path; from omni_core.state import HealthStore\n"
        "for j in range(25):\n"
        "    HealthStore(Path(sys.argv[1])).update({(f'd{sys.argv[2]}', '1', f'p{j}'): {'status': 'ok'}})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(i)]) for i in range(6)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 6
    data = HealthStore(tmp_path).read()
    assert len(data) == 6 * 25
    assert scratch_in(tmp_path) == []


# --------------------------------------------------------------------------- 4. concurrent first use


@needs_flux
def test_concurrent_first_generate_on_an_empty_cache_all_succeed(home: Path):
    procs = [
        start(home, "generate", "a fox", "--seed", str(i), "--no-progress", "--out", f"fox{i}.png") for i in range(3)
    ]
    results = [ok(finish(p)) for p in procs]
    assert sum("making the embedded default" in r.stdout for r in results) == 1  # made once, under the lock
    from PIL import Image

    for i in range(3):
        with Image.open(home / f"fox{i}.png") as img:
            img.load()
            assert img.size == (256, 256)
    assert scratch_in(home / "cache" / "tiny") == []


@needs_vits
def test_concurrent_first_speak_on_an_empty_cache_all_succeed(home: Path):
    # the fallback voice is the one made on first use (piper's installed voice needs nothing made)
    procs = [
        start(home, "speak", f"Hello number {i}.", "--seed", "0", "--out", f"hi{i}.wav", OMNI_DISABLE_PLUGINS="piper")
        for i in range(3)
    ]
    results = [ok(finish(p)) for p in procs]
    assert sum("making the embedded default" in r.stdout for r in results) == 1
    for i in range(3):
        with wave.open(str(home / f"hi{i}.wav")) as w:
            assert w.getnframes() > 0
    assert scratch_in(home / "cache" / "tiny") == []


# --------------------------------------------------------------------------- 5. replacing directories


def _checkpoint(path: Path, seed: int = 7) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["FixtureStateModel"], "init_seed": seed}))
    (path / "omni-tiny.json").write_text(json.dumps({"family": "fixture-state", "seed": seed}))
    return path


def _photos(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "holiday.jpg").write_bytes(b"\xff\xd8\xff" + bytes(1000))
    (path / "notes.txt").write_text("keep me")
    return path


def _a_file(path: Path) -> Path:
    path.write_text("not a directory")
    return path


#: (id, makes what is at the target, extra arguments, environment, exit code, words)
MAKE_TINY_ROWS: list[tuple[str, Callable[[Path], Any] | None, list[str], dict[str, str], int, list[str]]] = [
    ("non-empty-without-force", _checkpoint, [], {}, 1, ["not empty", "--force"]),
    ("force-on-a-folder-of-photos", _photos, ["--force"], {}, 1, ["not a checkpoint", "--force-any"]),
    ("force-on-a-file", _a_file, ["--force"], {}, 1, ["is a file"]),
    ("maker-raises-half-way", _checkpoint, ["--force"], {"OMNI_FIXTURE_TINY": "raise"}, 1, ["make_tiny", "half-way"]),
    ("maker-raises-new-dir", None, [], {"OMNI_FIXTURE_TINY": "raise"}, 1, ["make_tiny", "nothing was written"]),
]


@pytest.mark.parametrize(
    ("setup", "args", "env", "code", "words"), [r[1:] for r in MAKE_TINY_ROWS], ids=[r[0] for r in MAKE_TINY_ROWS]
)
def test_make_tiny_refuses_or_fails_without_touching_the_old_directory(
    home: Path, site: Path, setup: Any, args: list[str], env: dict[str, str], code: int, words: list[str]
):
    target = home / "work" / "target"
    target.parent.mkdir()
    if setup is not None:
        setup(target)
    before = snapshot([target])
    result = omni(home, "models", "make-tiny", "fixture-state", target, *args, site=site, **env)
    assert_clean_failure(result, code, str(target), *words)
    assert_unchanged(before, target)
    if setup is None:
        assert not target.exists()
    assert scratch_in(target.parent) == []


@pytest.mark.parametrize(
    ("setup", "flag"), [(_checkpoint, "--force"), (_photos, "--force-any")], ids=["checkpoint", "photos"]
)
def test_make_tiny_replaces_what_it_was_told_to(home: Path, site: Path, setup: Any, flag: str):
    target = setup(home / "target")
    ok(omni(home, "models", "make-tiny", "fixture-state", target, "--seed", "3", flag, site=site))
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "omni-tiny.json", "weights.bin"]
    assert json.loads((target / "config.json").read_text())["init_seed"] == 3
    assert scratch_in(home) == []


@pytest.mark.parametrize(
    ("where", "words"),
    [(lambda h: UNWRITABLE / "tiny", ["permission denied"]), (lambda h: _a_file(h / "f") / "tiny", ["is a file"])],
    ids=["unwritable-place", "under-a-file"],
)
def test_make_tiny_into_a_place_it_cannot_write_is_a_clear_error(home: Path, site: Path, where: Any, words: list[str]):
    target = where(home)
    result = omni(home, "models", "make-tiny", "fixture-state", target, site=site)
    assert_clean_failure(result, 1, str(target.parent), *words)


def test_a_killed_make_tiny_leaves_the_old_checkpoint_and_the_next_run_sweeps_its_scratch(home: Path, site: Path):
    target = _checkpoint(home / "target")
    before = snapshot([target])
    ready = home / "ready"
    proc = start(
        home, "models", "make-tiny", "fixture-state", target, "--force", site=site,
        OMNI_FIXTURE_TINY="hang", OMNI_FIXTURE_READY=str(ready),
    )  # fmt: skip
    wait_for(ready, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert_unchanged(before, target)
    assert scratch_in(home), "the killed run's scratch should still be there (nothing could remove it)"
    ok(omni(home, "models", "make-tiny", "fixture-state", target, "--force", site=site))
    assert scratch_in(home) == []
    assert (target / "weights.bin").is_file()


# ----- the cache directory the embedded defaults live in

CACHE_DIR_ROWS = [
    ("cache-is-a-file", lambda h: _a_file(h / "cache-file"), ["is a file", "OMNI_CACHE_DIR"]),
    ("cache-unwritable", lambda h: UNWRITABLE, ["permission denied", "OMNI_CACHE_DIR"]),
]
EMBEDDED = [
    pytest.param(("generate", "a fox", "--out", "fox.png"), {}, marks=needs_flux, id="generate"),
    # the fallback voice is made in the cache (a real default voice is installed, and needs none)
    pytest.param(
        ("speak", "Hello.", "--out", "hi.wav"), {"OMNI_DISABLE_PLUGINS": "piper"}, marks=needs_vits, id="speak"
    ),
]


@pytest.mark.parametrize(("command", "env"), EMBEDDED)
@pytest.mark.parametrize(("cache", "words"), [r[1:] for r in CACHE_DIR_ROWS], ids=[r[0] for r in CACHE_DIR_ROWS])
def test_the_embedded_default_in_a_bad_cache_dir_is_a_clear_error(
    home: Path, cache: Any, words: list[str], command: tuple[str, ...], env: dict[str, str]
):
    where = cache(home)
    result = omni(home, *command, OMNI_CACHE_DIR=str(where), **env)
    assert_clean_failure(result, 1, str(where), *words)
    assert not (home / command[-1]).exists()


@pytest.mark.parametrize(("cache", "words"), [r[1:] for r in CACHE_DIR_ROWS], ids=[r[0] for r in CACHE_DIR_ROWS])
@pytest.mark.parametrize("command", [("plugins", "list"), ("plugins", "list", "--load"), ("doctor",)], ids="-".join)
def test_commands_that_only_cache_keep_working_silently_in_a_bad_cache_dir(
    home: Path, cache: Any, words: list[str], command: tuple[str, ...], baseline_codes: dict[tuple[str, ...], int]
):
    where = cache(home)
    result = omni(home, *command, OMNI_CACHE_DIR=str(where))
    assert result.returncode == baseline_codes[command], result.stdout + result.stderr
    assert_no_traceback(result)
    assert str(where) not in result.stderr


# --------------------------------------------------------------------------- 6. outputs

#: (id, files there before, out (relative to the directory; None: the directory itself), format,
#:  kind, n, the files planned, or the words of the OutputError)
PLAN_ROWS: list[tuple[str, list[str], str | None, str | None, str, int, list[str] | str]] = [
    ("named-file", [], "fox.png", None, "image", 1, ["fox.png"]),
    ("named-file-is-replaced", ["fox.png"], "fox.png", None, "image", 1, ["fox.png"]),
    ("no-suffix-gets-the-format", [], "fox", None, "image", 1, ["fox.png"]),
    ("several-are-numbered", [], "fox.png", None, "image", 3, ["fox-1.png", "fox-2.png", "fox-3.png"]),
    ("numbered-never-overwrite", ["fox-2.png"], "fox.png", None, "image", 3, "fox-2.png already exists"),
    ("directory-by-stem", [], None, None, "image", 1, ["fam-seed7.png"]),
    ("directory-takes-the-next-free-name", ["fam-seed7.png"], None, None, "image", 1, ["fam-seed7-1.png"]),
    (
        "directory-skips-taken-numbers",
        ["fam-seed7-1.png", "fam-seed7-3.png"],
        None,
        None,
        "image",
        2,
        ["fam-seed7-2.png", "fam-seed7-4.png"],
    ),
    ("directory-video-default-mp4", [], None, None, "video", 2, ["fam-seed7-1.mp4", "fam-seed7-2.mp4"]),
    ("video-as-gif", [], "clip.gif", None, "video", 1, ["clip.gif"]),
    ("image-as-mp4", [], "x.mp4", None, "image", 1, "cannot write an image as 'mp4'"),
    ("image-as-txt", [], "x.txt", None, "image", 1, "cannot write an image as 'txt'"),
    ("video-as-png", [], "x.png", None, "video", 1, "cannot write a video as 'png'"),
    ("format-unknown", [], "x.png", "jpeg", "image", 1, "cannot write an image as 'jpeg'"),
    ("format-contradicts-name", [], "x.mp4", "gif", "video", 1, "--format gif does not match"),
]


@pytest.mark.parametrize(
    ("existing", "out", "fmt", "kind", "n", "expected"), [r[1:] for r in PLAN_ROWS], ids=[r[0] for r in PLAN_ROWS]
)
def test_plan_outputs(
    tmp_path: Path, existing: list[str], out: str | None, fmt: str | None, kind: str, n: int, expected
):
    for name in existing:
        (tmp_path / name).write_bytes(b"unrelated")
    before = snapshot([tmp_path])
    where = tmp_path / out if out is not None else tmp_path
    if isinstance(expected, str):
        with pytest.raises(OutputError, match=expected.replace("(", r"\(")):
            plan_outputs(where, fmt, kind, n, stem="fam-seed7")
    else:
        assert plan_outputs(where, fmt, kind, n, stem="fam-seed7") == [tmp_path / e for e in expected]
    assert_unchanged(before, tmp_path)


@pytest.fixture(scope="module")
def gen_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose embedded default image model is already made, and a good fox.png."""
    home = tmp_path_factory.mktemp("gen")
    ok(omni(home, "generate", "a fox", "--seed", "0", "--no-progress", "--out", "good.png"))
    return home


@pytest.fixture(scope="module")
def broken_flux(gen_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny image checkpoint with truncated weights: loading it fails, so a row that names
    some other problem proves it was found before any weight loaded."""
    broken = tmp_path_factory.mktemp("broken") / "flux"
    shutil.copytree(gen_home / "cache" / "tiny" / "flux1-schnell", broken)
    for weights in broken.rglob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])
    return broken


@needs_flux
def test_a_write_that_fails_half_way_leaves_the_old_output(gen_home: Path):
    good = gen_home / "good.png"
    target = gen_home / "fox.png"
    shutil.copy(good, target)
    before = snapshot([target])
    # 64 kB is far less than the ~170 kB PNG: the write fails with EFBIG in the middle
    result = omni(gen_home, "generate", "a fox", "--seed", "1", "--no-progress", "--out", "fox.png", fsize=64_000)
    assert_clean_failure(result, 1, "fox.png", "too large")
    assert_unchanged(before, target)
    assert scratch_in(gen_home) == []


@needs_flux
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--out", "x.mp4"], ["cannot write an image as 'mp4'"]),
        (["--out", "x.txt"], ["cannot write an image as 'txt'"]),
        (["--out", "x.png", "--format", "gif"], ["cannot write an image as 'gif'"]),
        (["--out", "taken.png", "-n", "2"], ["taken-2.png", "already exists"]),
    ],
    ids=["mp4-for-an-image", "txt", "format-gif", "n-would-overwrite"],
)
def test_output_problems_are_found_before_any_weight_loads(
    gen_home: Path, broken_flux: Path, args: list[str], words: list[str]
):
    (gen_home / "taken-2.png").write_bytes(b"an unrelated file")
    before = snapshot([gen_home / "taken-2.png"])
    result = omni(gen_home, "generate", "a fox", "--model", broken_flux, "--no-progress", *args)
    assert_clean_failure(result, 1, *words)
    assert_unchanged(before, gen_home / "taken-2.png")
    assert not (gen_home / "taken-1.png").exists() and not (gen_home / "x.mp4").exists()


@needs_flux
def test_n_outputs_with_free_names_are_written(gen_home: Path):
    ok(omni(gen_home, "generate", "a fox", "--seed", "2", "-n", "2", "--no-progress", "--out", "pair.png"))
    assert (gen_home / "pair-1.png").is_file() and (gen_home / "pair-2.png").is_file()
    result = omni(gen_home, "generate", "a fox", "--seed", "2", "-n", "2", "--no-progress", "--out", "pair.png")
    assert_clean_failure(result, 1, "pair-1.png", "already exist")


#: long enough that its audio is far past the 64 kB size limit of the failing rows
LONG_TEXT = " ".join(["word"] * 60)


def _good_wav(path: Path, frames: int = 1600) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(bytes(2 * frames))
    return path


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_speech_write_that_fails_half_way_leaves_the_old_file(home: Path, site: Path, tone_model: Path, stream: bool):
    target = _good_wav(home / "speech.wav")
    before = snapshot([target])
    args = ["speak", LONG_TEXT, "--model", tone_model, "--out", target, *(["--stream"] if stream else [])]
    result = omni(home, *args, site=site, fsize=64_000)
    assert_clean_failure(result, 1, str(target), "too large")
    assert_unchanged(before, target)
    assert scratch_in(home) == []


def test_a_killed_stream_leaves_the_old_file_and_the_next_write_sweeps_its_scratch(
    home: Path, site: Path, tone_model: Path
):
    target = _good_wav(home / "speech.wav")
    before = snapshot([target])
    ready = home / "ready"
    text = "one two three four HANG five"
    proc = start(
        home, "speak", text, "--model", tone_model, "--stream", "--out", target, site=site,
        OMNI_FIXTURE_READY=str(ready),
    )  # fmt: skip
    wait_for(ready, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert_unchanged(before, target)
    assert scratch_in(home), "the killed stream's partial file should still be there (nothing could remove it)"
    ok(omni(home, "speak", "one two three", "--model", tone_model, "--stream", "--out", target, site=site))
    assert scratch_in(home) == []
    with wave.open(str(target)) as w:
        assert w.getnframes() == 3 * int(0.12 * 16000)


@needs_flux
def test_corrupt_caches_do_not_stop_generate(gen_home: Path, tmp_path: Path):
    home = tmp_path
    shutil.copytree(gen_home / "cache", home / "cache")
    _corrupt(home / "cache" / "plugin-health.json", b"\x00garbage")
    _corrupt(home / "cache" / "manifest-cache.json", b"[1, 2]")
    ok(omni(home, "generate", "a fox", "--seed", "0", "--no-progress", "--out", "fox.png"))
    for name in CACHE_FILES:
        assert isinstance(json.loads((home / "cache" / name).read_text()), dict)
