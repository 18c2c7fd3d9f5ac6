"""One error hierarchy: every error omni raises is a class in ``omni_core/errors.py`` under
``OmniError``, with one builtin base, structured context, one exit code and one HTTP status;
the ``omni`` command maps each class to its exit code; one formatter turns pydantic's
validation errors into user messages."""

from __future__ import annotations

import ast
import importlib
import pickle
import pkgutil
from pathlib import Path

import pytest
from faults import assert_clean_failure

import omni_core
from omni_core import errors
from omni_core.errors import OmniError

ROOT = Path(__file__).resolve().parent.parent
#: the builtin bases an error may have: exactly one per class (see omni_core/errors.py)
CATEGORIES = (ValueError, LookupError, OSError, ImportError, RuntimeError)
EXIT_CODES = {1, 3}  # 0, 2 and 130 are success, click's usage errors and Ctrl-C: never an error class's
HTTP_STATUSES = {400, 401, 404, 409, 413, 429, 499, 500, 503, 504}
#: what the core's extras bring (``omni-core[serve]``); without them their modules cannot import
OPTIONAL_IMPORTS = {"fastapi", "starlette", "uvicorn", "prometheus_client", "python_multipart"}
CONTEXT = {"kind": "attention_backend", "name": "FLASH_ATTN", "plugin": "cuda", "field": "default.backend"}


def _all_core_error_classes() -> list[type[OmniError]]:
    """Every OmniError subclass, after importing every omni_core module (so a class defined
    anywhere in the core is found, wherever it lives)."""
    for info in pkgutil.walk_packages(omni_core.__path__, "omni_core."):
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            # a module of an extra this environment lacks (the server without fastapi): the
            # source scan below still reads it, and errors.py holds every class anyway
            if (exc.name or "").split(".")[0] not in OPTIONAL_IMPORTS:
                raise
    found: set[type[OmniError]] = set()
    todo: list[type[OmniError]] = [OmniError]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.add(cls)
            todo += cls.__subclasses__()
    return sorted(found, key=lambda c: c.__name__)


CLASSES = _all_core_error_classes()


def _make(cls: type[OmniError], **context: str) -> OmniError:
    if cls is errors.PluginLoadError:
        return cls(["plugin 'x': import-failed"], **context)
    return cls("something went wrong; do this to fix it", **context)


def test_the_battery_found_the_hierarchy() -> None:
    names = {c.__name__ for c in CLASSES}
    # classes that used to live beside their raise sites, and the CLI's and plugins' own
    assert {"RecipeError", "GenerationOptionError", "FileWriteError", "PluginCommandError", "ModelLoadError"} <= names
    assert len(CLASSES) >= 25


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_follows_the_rules(cls: type[OmniError]) -> None:
    assert cls.__module__ == "omni_core.errors", f"{cls.__name__} is defined in {cls.__module__}, not omni_core.errors"
    assert (cls.__dict__.get("__doc__") or "").strip(), f"{cls.__name__} has no docstring of its own"
    assert cls.exit_code in EXIT_CODES, f"{cls.__name__}.exit_code is {cls.exit_code}"
    assert cls.http_status in HTTP_STATUSES, f"{cls.__name__}.http_status is {cls.http_status}"
    bases = [b for b in CATEGORIES if issubclass(cls, b)]
    if cls is OmniError:
        assert bases == []
    else:
        assert len(bases) == 1, f"{cls.__name__} has builtin bases {[b.__name__ for b in bases]}; exactly one of them"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_context_round_trips(cls: type[OmniError]) -> None:
    error = _make(cls, **CONTEXT)
    assert {k: getattr(error, k) for k in CONTEXT} == CONTEXT
    data = error.to_dict()
    assert {k: data[k] for k in CONTEXT} == CONTEXT
    assert (data["error"], data["message"]) == (cls.__name__, str(error))
    assert (data["exit_code"], data["http_status"]) == (cls.exit_code, cls.http_status)
    again = pickle.loads(pickle.dumps(error))  # errors cross process boundaries between stages
    assert type(again) is cls and again.to_dict() == data
    bare = _make(cls)
    assert {k: getattr(bare, k) for k in CONTEXT} == dict.fromkeys(CONTEXT)


def test_kind_enum_context_is_its_value() -> None:
    from omni_core.kinds import Kind

    assert errors.UnknownExtensionError("x", kind=Kind.ATTENTION_BACKEND).to_dict()["kind"] == "attention_backend"


OLD_PLACES = [
    ("omni_core.generation.recipe", "RecipeError", "RecipeError"),
    ("omni_core.generation.resolve", "ModelResolutionError", "ModelResolutionError"),
    ("omni_core.generation.media", "MediaEncodingError", "MediaEncodingError"),
    ("omni_core.generation.request", "GenerationOptionError", "GenerationOptionError"),
    ("omni_core.attention.config", "AttentionConfigError", "AttentionConfigError"),
    ("omni_core.fsutil", "FileWriteError", "FileWriteError"),
    ("omni_core.speech.detection", "TTSDetectionError", "TTSDetectionError"),
    ("omni_core.speech.request", "SpeechRequestError", "SpeechRequestError"),
    ("omni_core.speech", "SpeechRequestError", "SpeechRequestError"),
    ("omni_core.api", "ModelNotServedError", "ModelNotServedError"),
    ("omni_core.offload", "OffloadConfigError", "OffloadConfigError"),
    ("omni_core.platforms", "ProbeTimeout", "ProbeTimeoutError"),
]


@pytest.mark.parametrize(("module", "old", "new"), OLD_PLACES, ids=lambda x: str(x))
def test_old_import_paths_name_the_same_class(module: str, old: str, new: str) -> None:
    assert getattr(importlib.import_module(module), old) is getattr(errors, new)


def _defined_exception_classes(path: Path) -> list[str]:
    """Classes in ``path`` deriving from something named like an exception."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = [getattr(b, "id", None) or getattr(b, "attr", "") for b in node.bases]
            if any(n.endswith(("Error", "Exception", "Timeout")) for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return found


def _shipped_sources() -> list[Path]:
    """The core's, the CLI's and the shipped plugins' modules (not their tests)."""
    files = [*(ROOT / "omni_core").rglob("*.py"), *(ROOT / "cli" / "omni_cli").rglob("*.py")]
    return files + [p for p in (ROOT / "omni_plugins").rglob("*.py") if "tests" not in p.relative_to(ROOT).parts]


def test_no_error_class_outside_errors_py() -> None:
    """The core, the CLI and the plugins shipped here define no exception classes of their own:
    plugins raise the core's (ModelLoadError for a checkpoint that cannot be loaded)."""
    errors_py = ROOT / "omni_core" / "errors.py"
    stray = [c for f in _shipped_sources() if f != errors_py for c in _defined_exception_classes(f)]
    assert not stray, "error classes outside omni_core/errors.py:\n" + "\n".join(stray)


def test_only_errors_py_reads_pydantic_errors() -> None:
    """One formatter: no other module walks a ValidationError's ``.errors()`` itself."""
    own = [f.relative_to(ROOT) for f in _shipped_sources() if ".errors()" in f.read_text(encoding="utf-8")]
    assert [str(f) for f in own] == ["omni_core/errors.py"]


# -- one pydantic-error formatter -----------------------------------------------------------


def test_generation_request_errors() -> None:
    from omni_core.generation.request import GenerationOptionError, GenerationRequest

    with pytest.raises(GenerationOptionError) as info:
        GenerationRequest.parse({"prompt": "a fox", "steps": 4})
    assert str(info.value).startswith("invalid generation request: unknown option 'steps' (accepted: prompt, ")
    assert "num_inference_steps" in str(info.value) and info.value.field == "steps"
    with pytest.raises(GenerationOptionError, match=r"^invalid generation request: the prompt is blank; describe"):
        GenerationRequest.parse({"prompt": "  "})  # our own validator's message, said once
    with pytest.raises(GenerationOptionError, match=r"^invalid generation request: width: Input should be a valid"):
        GenerationRequest.parse({"prompt": "a fox", "width": "wide"})


def test_speech_request_errors() -> None:
    from omni_core.speech.request import SpeechRequest, SpeechRequestError

    with pytest.raises(SpeechRequestError) as info:
        SpeechRequest.parse({"input": "hi", "colour": "red", "speed": 9})
    assert str(info.value) == (
        "invalid speech request: speed: Input should be less than or equal to 4; unknown field 'colour' "
        "(accepted: input, voice, response_format, speed, sample_rate, language, instructions, ref_audio, "
        "ref_text, seed, stream, max_new_tokens)"
    )


def test_attention_config_errors_name_the_nested_keys() -> None:
    from omni_core.attention.config import AttentionConfig, AttentionConfigError

    with pytest.raises(AttentionConfigError) as info:
        AttentionConfig.parse('{"per_role": {"self": {"foo": 1}}}')
    assert str(info.value) == (
        "invalid attention config: unknown field 'per_role.self.foo' "
        "(accepted: backend, quant, skip_softmax, block_sparse)"
    )
    assert info.value.field == "per_role.self.foo"
    with pytest.raises(AttentionConfigError) as info:
        AttentionConfig.parse({"default": {"skip_softmax": {}}})  # a model validator: located
    assert str(info.value) == (
        "invalid attention config: default.skip_softmax: give exactly one of target_sparsity or threshold"
    )


def test_recipe_errors(tmp_path: Path) -> None:
    from omni_core.generation.recipe import RecipeError, load_recipe

    bad = tmp_path / "bad.yaml"
    bad.write_text("model_class_name: flux1-dev\ngeneration: {steps: 28}\nofload: [layerwise]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(bad)
    message = str(info.value)
    assert message.startswith(f"invalid recipe {bad}: ")
    assert "unknown generation setting(s) ['steps']" in message
    assert "unknown field 'ofload' (accepted: model, description, model_class_name, attention, offload," in message
    assert info.value.name == str(bad)


def test_registration_errors_carry_the_plugin() -> None:
    from omni_core.registry import ModelRegistrar, Provider

    with pytest.raises(errors.RegistrationError) as info:
        ModelRegistrar(Provider("demo", "omni-plugin-demo", "1.0")).register("bad name", "pkg.mod:Model")
    assert str(info.value).startswith("plugin 'demo' registered an invalid model 'bad name': name: ")
    assert (info.value.kind, info.value.name, info.value.plugin) == ("model", "bad name", "demo")


def test_lookup_errors_carry_the_kind_and_name() -> None:
    from omni_core.kinds import Kind
    from omni_core.registry import Registry

    with pytest.raises(errors.UnknownExtensionError) as info:
        Registry(Kind.OFFLOADER).get("sequential")
    assert info.value.to_dict() | {"message": ""} == {
        "error": "UnknownExtensionError",
        "message": "",
        "kind": "offloader",
        "name": "sequential",
        "plugin": None,
        "field": None,
        "exit_code": 1,
        "http_status": 404,
    }


# -- the CLI: one handler, each class's exit code -------------------------------------------


def test_strict_mode_exits_3_from_every_command_that_reports_errors(install_plugins) -> None:
    """``generate``, ``speak`` and ``models make-tiny`` catch omni's errors to report them; a
    strict-mode PluginLoadError caught there still exits 3, as the class declares (it was 1)."""
    venv = install_plugins("omni-fixture-import-fails")
    for args in (
        ["generate", "a fox", "--out", "fox.png"],
        ["speak", "hello", "--out", "hello.wav"],
        ["models", "make-tiny", "vits", "tiny-vits"],
    ):
        result = venv.omni("--strict", *args)
        assert_clean_failure(result, 3, "plugin problem(s)", "import-failed")
    lenient = venv.omni("models", "make-tiny", "vits", "tiny-vits")
    assert_clean_failure(lenient, 1, "no installed family is called 'vits'")


def test_plugin_commands_end_in_omni_errors(install_plugins) -> None:
    venv = install_plugins("omni-fixture-errors")
    result = venv.omni("not-a-command")
    assert_clean_failure(result, 1, "command 'not-a-command'", "refers to int, not a Typer app", "omni plugins disable")
    assert "internal error" not in result.stderr  # it was "internal error: PluginCommandError: ..."
    assert_clean_failure(venv.omni("load-fails"), 1, "error: fixture checkpoint is truncated; re-download it")
    # a plugin's own subclass cannot make omni exit with a code outside its set
    assert_clean_failure(venv.omni("odd-exit-code"), 1, "error: odd failure from a plugin")
