"""Every error omni raises on purpose: one hierarchy under :class:`OmniError`, all in this file.

Each message names the problem and the fix. Besides the message, every error carries the same
structured context, keyword-only and ``None`` where it does not apply: ``kind`` (the extension
kind, e.g. ``attention_backend``), ``name`` (the extension, model, option or file concerned),
``plugin`` (the plugin at fault or providing it) and ``field`` (the setting or request field),
as attributes and through :meth:`OmniError.to_dict` (the JSON body of a server's error).

**Builtin bases.** Every subclass has exactly one of these among its bases, so ``except
ValueError`` and the like keep working in code that knows nothing of omni:

============  =================================================================================
ValueError    a value given to omni is wrong: an option, a request field, a config, recipe or
              manifest entry, a registration (the caller can fix it by changing the value)
LookupError   a name or a model was looked up and nothing, or more than one thing, answers it
OSError       the operating system refused: a file cannot be written
ImportError   code behind a lazy reference cannot be imported
RuntimeError  something failed while running: a plugin, a model, an encoder, strict mode's
              verdict on the plugins that loaded
============  =================================================================================

**Exit code and HTTP status.** Each class declares ``exit_code`` (what ``omni`` exits with:
1, or 3 for :class:`PluginLoadError` in strict mode; 0, 2 and 130 belong to success, usage
errors and Ctrl-C and are never an error class's) and ``http_status`` (what a server answers:
400 for a bad request value, 401 without the API key, 404 for an unknown name, 409 for an
unresolved conflict, 413 for a body over a limit, 429 for a full queue, 500 for the server's own
setup or a failure while running, 503 while not ready or when no platform can serve, 504 for a
request stopped at its deadline). Subclasses
inherit them; ``tests/test_errors.py`` checks every class has both, a docstring, and lives here.

Old import paths (``omni_core.generation.request.GenerationOptionError`` and the like) keep
working: each module that used to define a class imports it from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Self

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pydantic import ValidationError


class OmniError(Exception):
    """Base class of every error omni raises on purpose."""

    #: what ``omni`` exits with when this error ends a command (see the module docstring)
    exit_code: ClassVar[int] = 1
    #: what a server answers for this error
    http_status: ClassVar[int] = 500

    def __init__(
        self,
        message: str = "",
        *,
        kind: object = None,
        name: str | None = None,
        plugin: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        # set after the builtin base's __init__: ImportError's own __init__ resets ``name``
        self.kind = str(kind) if kind is not None else None
        self.name = name
        self.plugin = plugin
        self.field = field

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON-ready data: its class, message, context, exit code and HTTP status."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "kind": self.kind,
            "name": self.name,
            "plugin": self.plugin,
            "field": self.field,
            "exit_code": self.exit_code,
            "http_status": self.http_status,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled with its context (errors cross process boundaries between stages), whatever
        # the subclass's __init__ takes
        context = {"kind": self.kind, "name": self.name, "plugin": self.plugin, "field": self.field}
        return _rebuild, (type(self), self.args, {**self.__dict__, **context})  # ImportError keeps ``name`` in a slot

    @classmethod
    def from_validation(
        cls,
        exc: ValidationError,
        *,
        what: str,
        model: Any = None,
        noun: str = "field",
        **context: Any,
    ) -> Self:
        """This error for a pydantic ``ValidationError``: the message from
        :func:`format_validation_error`, ``field`` the first failing location unless given."""
        errors = exc.errors()
        if "field" not in context and errors:
            context["field"] = ".".join(str(p) for p in errors[0]["loc"]) or None
        return cls(format_validation_error(exc, what=what, model=model, noun=noun), **context)


def _rebuild(cls: type[OmniError], args: tuple[Any, ...], state: dict[str, Any]) -> OmniError:
    error = cls.__new__(cls, *args)
    Exception.__init__(error, *args)
    for key, value in state.items():
        setattr(error, key, value)
    return error


#: where an HTTP request's value came from, as FastAPI puts it first in an error's location
_HTTP_PARTS = frozenset({"body", "query", "path", "header"})


def validation_problems(exc: Any, *, model: Any = None, noun: str = "field") -> list[str]:
    """One readable line per pydantic error: the one place that decides how they read.
    ``exc`` is a ``ValidationError`` or anything with its ``errors()`` (a server's request
    validation error, whose locations start with ``body`` or ``query``, which are dropped).

    * an unknown key: ``unknown field 'x' (accepted: a, b, c)``, the accepted names taken from
      ``model`` (followed through nested models, so ``per_role.self.foo`` lists a role's keys);
      ``noun`` says what the keys are called to the user (``option`` for generation requests);
    * our own validators' messages (a ``ValueError`` raised in a validator) as they are, after
      the location unless the message already names the field;
    * anything else as ``location: pydantic's message``.
    """
    problems = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        if loc and loc[0] in _HTTP_PARTS:
            loc = loc[1:]
        where = ".".join(loc)
        if error["type"] == "json_invalid":
            problems.append("the body is not valid JSON; send a JSON object")
        elif error["type"] in ("model_attributes_type", "dict_type", "model_type") and not loc:
            problems.append("the body must be a JSON object")
        elif error["type"] == "extra_forbidden":
            accepted = _accepted_keys(model, loc[:-1])
            hint = f" (accepted: {', '.join(accepted)})" if accepted else ""
            problems.append(f"unknown {noun} {where!r}{hint}")
        elif error["type"] in ("value_error", "assertion_error") and "error" in error.get("ctx", {}):
            message = str(error["ctx"]["error"])
            problems.append(message if not loc or loc[-1] in message else f"{where}: {message}")
        else:
            problems.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
    return problems


def first_location(exc: Any) -> str | None:
    """The dotted location of the first error (the request field to name), without ``body``."""
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        if loc and loc[0] in _HTTP_PARTS:
            loc = loc[1:]
        if error["type"] == "json_invalid":
            return None
        return ".".join(loc) or None
    return None


def format_validation_error(exc: ValidationError, *, what: str, model: Any = None, noun: str = "field") -> str:
    """``invalid {what}: problem; problem``: how every pydantic ``ValidationError`` (requests,
    recipes, attention configs, registrations) reads to a user (see :func:`validation_problems`)."""
    return f"invalid {what}: " + "; ".join(validation_problems(exc, model=model, noun=noun))


def _accepted_keys(model: Any, path: Iterable[str]) -> list[str]:
    """The field names of the pydantic model at ``path`` below ``model`` (empty if unknown)."""
    current: Any = model
    for part in path:
        current = _unwrap(current)
        if isinstance(current, _MappingOf):
            current = current.value  # ``part`` was a key of the mapping
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = fields[part].annotation
    current = _unwrap(current)
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X``; ``dict[str, X]`` -> a step through a mapping to ``X``."""
    import types
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is dict and args:
        return _MappingOf(args[-1])
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _unwrap(args[0])
    return annotation


class _MappingOf:
    """A step through ``dict[str, X]``: the next location part is a key, then comes ``X``."""

    def __init__(self, value: Any) -> None:
        self.value = value


class ManifestError(OmniError, ValueError):
    """A plugin's declared metadata (``omni_plugin.toml``) is missing or malformed."""


class ReferenceFormatError(OmniError, ValueError):
    """A lazy reference is not of the form ``package.module:attribute``."""


class LazyImportError(OmniError, ImportError):
    """Resolving a lazy reference failed: its module did not import or lacks the attribute."""


class RegistrationError(OmniError, ValueError):
    """A plugin registered something invalid from one of its hooks."""


class UnknownExtensionError(OmniError, LookupError):
    """A name was looked up that no active plugin provides."""

    http_status = 404


class ConflictError(OmniError, LookupError):
    """Two plugins provide the same name at the same priority and no pin decides between them."""

    http_status = 409


class PluginLoadError(OmniError, RuntimeError):
    """Raised in strict mode (``OMNI_STRICT_PLUGINS=1``) when any plugin has a problem."""

    #: strict mode's own exit code, so CI tells "a plugin is broken" from other failures
    exit_code = 3

    def __init__(self, problems: list[str], **context: Any) -> None:
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"{len(problems)} plugin problem(s) with OMNI_STRICT_PLUGINS=1:\n{lines}\n"
            "Fix or uninstall the plugins named above, or unset OMNI_STRICT_PLUGINS to skip them.",
            **context,
        )
        self.problems = problems


class PlatformSelectionError(OmniError, LookupError):
    """No platform, or more than one, could be chosen for this machine."""

    http_status = 503


class ConfigError(OmniError, ValueError):
    """The user configuration file or an environment variable holds an invalid value."""


class PluginExitError(OmniError, RuntimeError):
    """Plugin code raised ``SystemExit``, or ``KeyboardInterrupt`` with no Ctrl-C from the user.

    omni turns either into an ordinary failure of that plugin (see :mod:`omni_core.guard`), so
    a plugin cannot end a command or a server; the user's own Ctrl-C still stops omni.
    """


class OutputError(OmniError, ValueError):
    """Outputs cannot be written as asked: a format the model cannot produce, a ``--format``
    that contradicts the file name, or a name that would overwrite a file nobody asked for."""

    http_status = 400


class ModelLoadError(OmniError, RuntimeError):
    """A checkpoint could not be loaded (truncated or corrupt weights, a missing component, a
    runtime forced onto a checkpoint it cannot read): the message names the directory, the
    cause and the fix. Runtimes (the diffusion runtime, TTS adapters) raise it when loading fails."""


class CheckpointFormatError(ModelLoadError):
    """A file of a checkpoint (``config.json``, ``model_index.json``, a component's config, a
    weights header) is present but malformed: named as malformed, with its path, never as missing."""


class ModelRuntimeError(OmniError, RuntimeError):
    """A loaded model failed while generating: the message names the model and suggests a fix.
    The original exception is chained (``OMNI_DEBUG=1`` shows its traceback)."""


class DeclarationMismatchError(LazyImportError):
    """A loaded class states an identity attribute (``name``, ``device_types``, ``stage_keys``,
    ...) that differs from its registration in ``omni_plugin.toml``. The registration is the one
    source; raised when the reference is loaded, so callers that handle a failed load handle it."""


# -- moved here from the modules that raise them (each still imports its class from here) -----


class RecipeError(OmniError, ValueError):
    """A recipe file that cannot be read or does not validate (``--recipe``, ``Omni(recipe=)``)."""

    http_status = 400


class ModelResolutionError(OmniError, LookupError):
    """No model family, or more than one, answers for a checkpoint: the message lists the
    candidates and how to choose (``--model-class-name``, a recipe pin, installing a plugin)."""

    http_status = 404


class MediaEncodingError(OmniError, RuntimeError):
    """Generated images or videos could not be encoded (an encoder library missing or failing,
    a frame size the codec refuses)."""


class GenerationOptionError(OmniError, ValueError):
    """A generation option the model cannot take: the message names the rule and the fix."""

    http_status = 400


class AttentionConfigError(OmniError, ValueError):
    """An attention config that cannot be honoured: bad value, unknown name, or a backend
    chosen explicitly that cannot run here."""

    http_status = 400


class FileWriteError(OmniError, OSError):
    """A file or directory could not be written: the message names the path, the cause (disk
    full, permission, read-only, missing directory) and what to do."""


class TTSDetectionError(OmniError, LookupError):
    """No TTS adapter can be chosen for a checkpoint: the directory is missing, or two adapters
    at the same priority both claim it."""

    http_status = 404


class SpeechRequestError(OmniError, ValueError):
    """A speech request that cannot be served: the message names the rule and the fix."""

    http_status = 400


class ChatRequestError(OmniError, ValueError):
    """A chat request a multi-stage model cannot answer as asked (a modality it does not make,
    content it does not read, a voice it does not have): the message names the field and the fix."""

    http_status = 400


class ModelNotServedError(OmniError, LookupError):
    """No installed plugin serves the model directory (or the API it was asked for)."""

    http_status = 404


class OffloadConfigError(OmniError, ValueError):
    """An offload request that cannot be served: an unknown strategy, bad options, strategies
    that exclude each other or the run's features."""

    http_status = 400


class CacheConfigError(OmniError, ValueError):
    """A cache backend request that cannot be served: an unknown backend, bad options, a family
    that declares nothing for it, a combination it declares incompatible."""

    http_status = 400


class PluginCommandError(OmniError, RuntimeError):
    """A plugin command failed in a way that is the plugin's fault (a ``ref`` that is not a
    command): exit 1, the plugin named, with how to disable it."""


class ProbeTimeoutError(OmniError, RuntimeError):
    """A platform probe ran past ``OMNI_PROBE_TIMEOUT`` and was abandoned; recorded as that
    probe's failure, never raised to the user."""


# -- serving -------------------------------------------------------------------------------------


class RequestCancelled(OmniError, RuntimeError):
    """A running request was stopped on purpose: its client hung up or its deadline passed
    (:mod:`omni_core.cancel`). Never a fault of the model; the server answers 499-style
    (client gone) or 504 (deadline) itself, this status is the fallback."""

    http_status = 504


class ServerBusyError(OmniError, RuntimeError):
    """A model's queue is full: the request is refused at once (429 with Retry-After),
    never left waiting without bound."""

    http_status = 429


class ModelNotReadyError(OmniError, RuntimeError):
    """The server is still loading its models, is draining after SIGTERM, or a model's engine
    failed: 503 (``/health`` says which)."""

    http_status = 503


class RequestTooLargeError(OmniError, ValueError):
    """A request body or text field is over the server's limit (413), named with the limit and
    the flag that raises it."""

    http_status = 413


class AuthenticationError(OmniError, ValueError):
    """A request without the server's API key, or with the wrong one (401)."""

    http_status = 401


class EngineFailedError(OmniError, RuntimeError):
    """A model's engine can run no more requests (a lost device, a dead worker process): an
    engine raises it to say so. The request fails, and the server takes the model out of
    service: ``/health`` answers 503 naming it, and its requests get 503, until a restart."""

    http_status = 503


class ClientDisconnected(OmniError, RuntimeError):
    """The client hung up before its answer was ready: its work is cancelled and the request
    is logged as 499 (nobody is left to read a body)."""

    http_status = 499


class ServerStartError(OmniError, OSError):
    """``omni serve`` could not start: the port is taken, the address cannot be bound, or the
    serving extras are not installed. Exit 1 with the fix."""


# -- multi-stage pipelines ----------------------------------------------------------------------


class PipelineConfigError(OmniError, ValueError):
    """A pipeline's topology (declared by its model plugin) and placement (a recipe, CLI
    overrides) do not fit together: an unknown field, a field given to the wrong owner, an edge
    to a missing stage, an edge without a usable connector. Raised before any process starts,
    naming the field and the fix."""

    http_status = 400


class PipelineStartError(OmniError, RuntimeError):
    """A stage did not come up: its process exited, or it did not report ready within its
    start-up timeout. Every stage already started is stopped again."""


class StageFailedError(OmniError, RuntimeError):
    """A request failed in one stage: the stage's engine raised, its process died, or it ran
    past its timeout. ``name`` is the stage; the message says what happened and what to do."""

    http_status = 503


class StageRequestError(StageFailedError):
    """A stage refused a request as the caller's own mistake (a parameter it does not take, an
    input part it does not read, a voice it does not have): a 400, not a failure of the stage.
    ``field`` is the stage's field when it named one."""

    http_status = 400


class ConnectorError(OmniError, RuntimeError):
    """A connector could not move a payload: a put or get past its timeout, a handle that does
    not describe a payload (malformed metadata), a transport that failed."""


class PayloadError(OmniError, ValueError):
    """A payload cannot cross a stage boundary: a type the wire format does not carry, bytes
    that are not a payload, or a payload over the connector's size limit."""
