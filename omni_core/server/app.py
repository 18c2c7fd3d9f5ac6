"""The HTTP app: routes in the OpenAI API's shapes over the served models.

Every route does the same four things, in order: find the model (404 for a name nobody
serves, 503 while it loads), check the request completely (400 naming the field and the rule,
413 over a limit: all before any work is queued), hand the work to the model's queue (429
when it is full), and wait for it, cancelling it when the client hangs up or the deadline
passes (504). Whatever goes wrong answers with one error shape (:class:`ErrorResponse`),
never a stack trace; a 500 carries the request id that the server's log line also has.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omni_core.errors import (
    AuthenticationError,
    ClientDisconnected,
    EngineFailedError,
    GenerationOptionError,
    ModelNotReadyError,
    ModelRuntimeError,
    OmniError,
    RequestCancelled,
    RequestTooLargeError,
    ServerBusyError,
    SpeechRequestError,
)
from omni_core.server.config import ServerConfig
from omni_core.server.jobs import VideoJobs, VideoRecord
from omni_core.server.metrics import Metrics
from omni_core.server.models import Model, ModelTable
from omni_core.server.schemas import (
    ChatAnswer,
    ChatAudio,
    ChatChoice,
    ChatCompletion,
    ChatCompletionBody,
    ErrorResponse,
    Health,
    ImageData,
    ImageGenerationBody,
    ImagesResponse,
    ModelCard,
    ModelList,
    SpeechBody,
    VideoDeleted,
    VideoError,
    VideoGenerationBody,
    VideoJob,
    VideoJobList,
    parse_size,
)
from omni_core.server.worker import Job, ModelWorker

access_log = logging.getLogger("omni.serve.access")
log = logging.getLogger("omni.serve")

IMAGES = "/v1/images/generations"
SPEECH = "/v1/audio/speech"
VIDEOS = "/v1/videos"
CHAT = "/v1/chat/completions"

#: the OpenAI error ``type`` for each status
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}
_ERROR_DOC = {"model": ErrorResponse}
#: the errors every route may answer (documented in the OpenAPI schema; 422 never is)
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {**_ERROR_DOC, "description": "A field breaks a rule; the message names it and the fix."},
    401: {**_ERROR_DOC, "description": "The server has an API key and the request did not send it."},
    404: {**_ERROR_DOC, "description": "No such model (or job)."},
    413: {**_ERROR_DOC, "description": "The body or a text field is over the server's limit."},
    429: {**_ERROR_DOC, "description": "The model's queue is full; retry after Retry-After seconds."},
    500: {**_ERROR_DOC, "description": "The model failed on this request; the request id finds it in the log."},
    503: {**_ERROR_DOC, "description": "Loading, draining, or the model is out of service."},
    504: {**_ERROR_DOC, "description": "The request ran past the server's deadline and was cancelled."},
}


class ServerState:
    """What the routes share: the models, the video jobs, the metrics, the draining flag."""

    def __init__(self, config: ServerConfig, table: ModelTable) -> None:
        self.config = config
        self.table = table
        self.jobs = VideoJobs(config.job_ttl_s, config.max_jobs)
        self.metrics = Metrics(self._depths)
        self.draining = False
        self.video_tasks: set[asyncio.Task[None]] = set()

    def _depths(self) -> dict[str, tuple[int, int]]:
        return {name: (m.worker.depth, m.worker.busy) for name, m in self.table.models.items() if m.worker is not None}

    def make_worker(self, model: Model) -> ModelWorker:
        batch = self.metrics.batch_size.labels(model.name)
        return ModelWorker(
            model.name,
            queue_size=self.config.queue_size,
            max_batch=self.config.max_batch,
            batch_wait_s=self.config.batch_wait_ms / 1000.0,
            observe_batch=batch.observe,
        )


# -- errors ---------------------------------------------------------------------------------------


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {
        "error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param, "code": code}
    }
    return JSONResponse(body, status_code=status, headers=headers)


def _request_id(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", "-"))


def _note(request: Request, **fields: Any) -> None:
    """Facts for the request's log line (model, queue and run time, batch size)."""
    request.scope.setdefault("state", {}).setdefault("log", {}).update(fields)


def _validation_message(exc: Any, model: Any = None) -> tuple[str, str | None]:
    """pydantic's errors as omni words them everywhere (:func:`omni_core.errors.validation_problems`)."""
    from omni_core.errors import first_location, validation_problems

    return "; ".join(validation_problems(exc, model=model)[:5]), first_location(exc)


#: ``error.code``: stable words a client can branch on (never a class name), by status
ERROR_CODES = {
    400: "invalid_value",
    401: "invalid_api_key",
    404: "not_found",
    409: "conflict",
    413: "request_too_large",
    429: "queue_full",
    503: "unavailable",
    504: "timeout",
}
#: where one status has several causes a client may tell apart
_CODES_BY_ERROR: dict[type[OmniError], str] = {
    EngineFailedError: "engine_failed",
    ModelNotReadyError: "model_not_ready",
}


def _code(exc: OmniError) -> str:
    for cls, code in _CODES_BY_ERROR.items():
        if isinstance(exc, cls):
            return code
    return ERROR_CODES.get(exc.http_status, "error")


#: the request field a model's rule names first, for ``error.param`` (width and height arrive as size)
_PARAMS = {"width": "size", "height": "size", "num_outputs": "n"}


def _param_of(message: str) -> str | None:
    first = message.split(" ", 1)[0]
    return _PARAMS.get(
        first, first if (first.isidentifier() and "_" in first) or first in ("prompt", "seed", "fps") else None
    )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OmniError)
    async def omni_error(request: Request, exc: OmniError) -> Response:
        status = exc.http_status
        if isinstance(exc, ClientDisconnected):
            return Response(status_code=499)
        headers: dict[str, str] = {}
        if isinstance(exc, ServerBusyError):
            worker = request.app.state.omni.table.models.get(exc.name or "")
            headers["Retry-After"] = str(worker.worker.retry_after() if worker and worker.worker else 1)
        if isinstance(exc, ModelNotReadyError):
            headers["Retry-After"] = "5"
        if isinstance(exc, AuthenticationError):
            headers["WWW-Authenticate"] = "Bearer"
        if status >= 500 and status not in (503, 504):
            return _server_error(request, exc)
        return error_response(
            status, exc.message, param=exc.field or _param_of(exc.message), code=_code(exc), headers=headers
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        body_field = getattr(request.scope.get("route"), "body_field", None)
        body_model = getattr(getattr(body_field, "field_info", None), "annotation", None)
        message, param = _validation_message(exc, body_model)
        return error_response(400, message, param=param, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"no route {request.url.path}; GET /openapi.json lists this server's routes"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            # the router names the methods of the first route on the path only; Allow lists them all
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
        return error_response(exc.status_code, message, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return _server_error(request, exc)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route takes on the request's path."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, BaseRoute) and route.matches(request.scope)[0] != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


def _server_error(request: Request, exc: BaseException) -> Response:
    request_id = _request_id(request)
    model = request.scope.get("state", {}).get("log", {}).get("model")
    log.error("request %s failed: %s: %s", request_id, type(exc).__name__, exc, exc_info=exc)
    what = f"model {model!r} failed while running this request" if model else "the server failed on this request"
    return error_response(
        500,
        f"{what} (request id {request_id}); the server log has the cause under that id",
        code="internal_error",
        headers={"x-request-id": request_id},
    )


# -- middleware: request id, log line and metrics, body limit, auth --------------------------------


class Gate:
    """Pure ASGI (so streaming and disconnect detection stay untouched): gives every request
    an id, refuses bodies over the limit and requests without the key, and writes one log line
    and the metrics when the answer is complete."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        config = self.state.config
        request_id = f"req_{uuid.uuid4().hex[:20]}"
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        started = time.perf_counter()
        status_holder = {"status": 500}
        path = scope["path"]

        async def send_wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            await send(message)

        refusal = self._refusal(scope, config)
        try:
            if refusal is not None:
                await refusal(scope, receive, send_wrapped)
            else:
                await self.app(scope, self._limited(receive, config.max_body_bytes), send_wrapped)
        finally:
            self._record(scope, path, status_holder["status"], time.perf_counter() - started)

    def _refusal(self, scope: Scope, config: ServerConfig) -> ASGIApp | None:
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            return error_response(
                413,
                f"the request body is {int(length)} bytes; this server takes at most {config.max_body_bytes} "
                "(--max-body-mb)",
                code="request_too_large",
            )
        if config.api_key is not None and scope["path"].startswith("/v1/"):
            auth = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), config.api_key.encode()):
                why = "the API key is wrong" if auth else "no API key was sent"
                return error_response(
                    401,
                    f"{why}: send the server's key as 'Authorization: Bearer KEY'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return None

    @staticmethod
    def _limited(receive: Receive, limit: int) -> Receive:
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise RequestTooLargeError(
                        f"the request body is over {limit} bytes, this server's limit (--max-body-mb)"
                    )
            return message

        return wrapped

    def _record(self, scope: Scope, path: str, status: int, seconds: float) -> None:
        state = scope.get("state", {})
        facts = state.get("log", {})
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or ("unmatched" if status == 404 else path)
        model = str(facts.get("model", "-"))
        metrics = self.state.metrics
        if endpoint not in ("/metrics", "/health"):
            metrics.requests.labels(endpoint, model, str(status)).inc()
            metrics.latency.labels(endpoint, model).observe(seconds)
            if status >= 400:
                metrics.errors.labels(endpoint, model, ERROR_TYPES.get(status, "server_error")).inc()
        line = {
            "event": "request",
            "id": state.get("request_id"),
            "method": scope.get("method"),
            "endpoint": endpoint,
            "model": model,
            "status": status,
            "queue_ms": round(facts.get("queue_s", 0.0) * 1000, 1),
            "run_ms": round(facts.get("run_s", 0.0) * 1000, 1),
            "total_ms": round(seconds * 1000, 1),
        }
        if "batch" in facts:
            line["batch"] = facts["batch"]
        access_log.info(json.dumps(line))


# -- waiting for the model ----------------------------------------------------------------------


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body was read, so the next message is the hang-up)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _wait_for_model(
    waiting: set[asyncio.Future[Any]],
    request: Request,
    deadline: float,
    stop: Callable[[str], None],
    *,
    deadline_s: float,
    watch_hangup: bool = True,
    before: str = "its answer was ready",
) -> set[asyncio.Future[Any]]:
    """The futures of ``waiting`` that finished first. When the client hangs up first (where
    ``watch_hangup``: a streaming response watches for it itself once it has started) or the
    ``deadline`` (a ``time.monotonic()`` time) passes, ``stop(reason)`` cancels the work
    wherever it still runs and the cause is raised, named."""
    watcher = asyncio.ensure_future(_disconnected(request)) if watch_hangup else None
    try:
        done, _ = await asyncio.wait(
            {*waiting, *([watcher] if watcher else [])},
            timeout=max(0.0, deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        if watcher is not None:
            watcher.cancel()
    if done & waiting:
        return done & waiting
    if watcher is not None and watcher in done:
        stop("the client disconnected")
        raise ClientDisconnected(f"the client disconnected before {before}")
    stop("the request ran past the server's deadline (--request-timeout)")
    raise RequestCancelled(f"the request ran past the server's deadline of {deadline_s:g} s (--request-timeout)")


async def run_on_model(
    state: ServerState, model: Model, request: Request, run: Callable[[Job], Any], **job_fields: Any
) -> Any:
    """Queue ``run`` on the model's worker and wait for it; a hang-up or the deadline cancels it."""
    loop = asyncio.get_running_loop()
    job = Job(run=run, loop=loop, future=loop.create_future(), **job_fields)
    assert model.worker is not None
    model.worker.submit(job)
    _note(request, model=model.name)
    timeout = state.config.request_timeout_s
    try:
        await _wait_for_model({job.future}, request, time.monotonic() + timeout, job.token.cancel, deadline_s=timeout)
    finally:
        _note(request, queue_s=job.queue_seconds, run_s=job.run_seconds, batch=job.batch_size)
        state.metrics.queue_time.labels(model.name).observe(job.queue_seconds)
    if job.started is not None:
        state.metrics.run_time.labels(model.name).observe(job.run_seconds)
    error = job.future.exception()
    if error is not None and not isinstance(error, OmniError):
        # a plugin's own failure: this request fails (500), named; the cause goes to the log
        raise _model_failure(model, error) from error
    return job.future.result()


def _model_failure(model: Model, error: BaseException) -> ModelRuntimeError:
    """A plugin's own (non-omni) exception as this request's failure (500), the model named."""
    return ModelRuntimeError(f"model {model.name!r} failed: {type(error).__name__}: {error}")


def _limits(state: ServerState, model: Model, fields: dict[str, Any], what: str) -> None:
    """The server's own limits (beyond the model's), on the values the model will use."""
    config = state.config
    width = model.effective(fields, "width") or 0
    height = model.effective(fields, "height") or 0
    steps = model.effective(fields, "num_inference_steps") or 0
    problems: list[tuple[str, str]] = []
    if width * height > config.max_pixels:
        problems.append(
            (
                "size",
                f"{width}x{height} is {width * height} pixels; this server makes at most {config.max_pixels} "
                f"per {what} (--max-pixels)",
            )
        )
    if steps > config.max_steps:
        problems.append(
            (
                "num_inference_steps",
                f"num_inference_steps {steps} is over this server's limit of {config.max_steps} (--max-steps)",
            )
        )
    frames = fields.get("num_frames")
    if frames is not None and frames > config.max_frames:
        problems.append(
            ("num_frames", f"num_frames {frames} is over this server's limit of {config.max_frames} (--max-frames)")
        )
    if problems:
        raise GenerationOptionError("; ".join(p for _, p in problems), field=problems[0][0])


def _generation_fields(body: BaseModel, exclude: set[str]) -> dict[str, Any]:
    # an explicit null means "the default", as leaving the field out does
    fields = {k: v for k, v in body.model_dump(exclude_unset=True, exclude=exclude).items() if v is not None}
    size = getattr(body, "size", None)
    if size is not None:
        fields["width"], fields["height"] = parse_size(size)
    return fields


def _check_generation(model: Model, fields: dict[str, Any]) -> Any:
    """Every rule of the model on ``fields`` (recipe defaults applied), before queueing; the
    batch key when the request may share a pipeline call."""
    assert model.omni is not None
    return model.omni.batch_key(fields)


# -- the app --------------------------------------------------------------------------------------


def create_app(config: ServerConfig, table: ModelTable | None = None) -> FastAPI:
    """The FastAPI app over ``table`` (identified and, by the runner, loaded models)."""
    from omni_core import __version__

    if table is None:
        table = ModelTable(config)
    state = ServerState(config, table)
    app = FastAPI(
        title="omni",
        version=__version__,
        summary="Every model omni runs, behind an OpenAI-compatible API.",
        description="Images, speech, video and chat from the models this server was started with (`GET /v1/models`).",
        responses={},
        # the interactive pages load their scripts from a CDN; an offline server serves the schema itself
        docs_url=None,
        redoc_url=None,
    )
    app.state.omni = state
    _install_error_handlers(app)

    # -- service --------------------------------------------------------------------------

    @app.get(
        "/health",
        response_model=Health,
        summary="Whether the server is ready",
        response_description="Every model is loaded and in service.",
        responses={503: {"model": Health, "description": "Loading, draining, or a model is out of service."}},
    )
    async def health() -> Response:
        """Readiness for load balancers: 200 once every model is loaded, 503 with the reason
        before that, while draining, or when a model is out of service. No API key needed."""
        status, models = table.health()
        if state.draining:
            status = "draining"
        detail = None
        if status == "failed":
            detail = "; ".join(
                f"{m.name}: {m.error or (m.worker.fault if m.worker else '')}"
                for m in table.models.values()
                if m.state() == "failed"
            )
        body = Health(status=status, models=models, detail=detail)
        return JSONResponse(body.model_dump(), status_code=200 if status == "ready" else 503)

    @app.get(
        "/metrics",
        response_class=Response,
        summary="Prometheus metrics",
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}},
    )
    async def metrics() -> Response:
        """Request counts, latencies, queue depths and batch sizes, labelled by route template,
        model and status (never a request id). No API key needed."""
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def playground() -> HTMLResponse:
        page = resources.files("omni_core.server").joinpath("static/playground.html").read_text(encoding="utf-8")
        return HTMLResponse(page)

    @app.get(
        "/v1/models",
        response_model=ModelList,
        responses=ERRORS,
        summary="List the served models",
        response_description="Every model this server was started with, loaded or not.",
    )
    async def list_models() -> ModelList:
        """Each model's name (what requests send as `model`), task, routes, voices and status."""
        cards = [
            ModelCard(
                id=m.name,
                created=m.created,
                owned_by=m.provider,
                task=m.task,
                endpoints=list(m.endpoints),
                voices=m.voices,
                modalities=list(m.outputs),
                content_parts=list(m.reads) if m.multi_stage else [],
                status=m.state(),
            )
            for m in table.models.values()
        ]
        return ModelList(data=cards)

    # -- images ---------------------------------------------------------------------------

    @app.post(
        IMAGES,
        response_model=ImagesResponse,
        responses=ERRORS,
        summary="Generate images",
        response_description="The images, as base64 PNG, each with the seed it was made with.",
    )
    async def images(body: ImageGenerationBody, request: Request) -> ImagesResponse:
        """Images from a prompt. Requests that can share a pipeline call are batched; each
        keeps its own seed and gets the pixels it would get alone."""
        model = table.for_route(body.model, IMAGES)  # type: ignore[attr-defined]
        _note(request, model=model.name)
        if body.response_format == "url":  # type: ignore[attr-defined]
            raise GenerationOptionError(
                'response_format "url" is not offered: this server keeps no image files; use "b64_json"',
                field="response_format",
            )
        fields = _generation_fields(body, {"model", "n", "size", "response_format", "user"})
        n = body.n  # type: ignore[attr-defined]
        if n > config.max_images:
            raise GenerationOptionError(
                f"n {n} is over this server's limit of {config.max_images} images per request (--max-images)",
                field="n",
            )
        if n != 1:
            fields["num_outputs"] = n
        _limits(state, model, fields, "image")
        key = _check_generation(model, fields)
        omni = model.omni
        assert omni is not None

        def run(job: Job) -> list[ImageData]:
            return _images(omni.generate(job.payload))

        def run_batch(jobs: list[Job]) -> list[Any]:
            return [_images(result) for result in omni.generate_batch([j.payload for j in jobs])]

        data = await run_on_model(
            state, model, request, run, payload=fields, batch_key=key, run_batch=run_batch if key is not None else None
        )
        return ImagesResponse(created=int(time.time()), model=model.name, data=data)

    # -- speech ---------------------------------------------------------------------------

    @app.post(
        SPEECH,
        summary="Generate speech",
        response_class=Response,
        responses={
            **ERRORS,
            200: {
                "description": "The audio; chunked while made when stream is true; server-sent events for "
                'stream_format "sse".',
                "content": {
                    "audio/wav": {},
                    "audio/pcm": {},
                    "audio/flac": {},
                    "audio/mpeg": {},
                    "text/event-stream": {},
                },
            },
        },
    )
    async def speech(body: SpeechBody, request: Request) -> Response:
        """Speech from text: the whole audio in `response_format`, or, with `stream`, chunks
        as the model makes them (`stream_format` "sse": server-sent events)."""
        from omni_core.speech.engine import check_request
        from omni_core.speech.request import SpeechRequest

        model = table.for_route(body.model, SPEECH)  # type: ignore[attr-defined]
        _note(request, model=model.name)
        text = body.input  # type: ignore[attr-defined]
        if len(text) > config.max_input_chars:
            raise RequestTooLargeError(
                f"input is {len(text)} characters; this server takes at most {config.max_input_chars} "
                "(--max-input-chars)",
                field="input",
            )
        caps = model.capabilities
        assert caps is not None and model.omni is not None
        fields = body.model_dump(exclude_unset=True, exclude={"model", "stream_format"})
        voice = fields.get("voice")
        if voice == "default":
            fields["voice"] = None
        elif voice is not None and not caps.voices:
            raise SpeechRequestError(
                f'model {model.name!r} has no selectable voices; send voice "default" (got {voice!r})', field="voice"
            )
        sse = body.stream_format == "sse"  # type: ignore[attr-defined]
        streaming = sse or bool(fields.get("stream"))
        fields["stream"] = streaming
        if streaming and not sse and fields.get("response_format", "wav") not in ("wav", "pcm"):
            raise SpeechRequestError(
                "streamed audio is sent as wav or pcm; set response_format to one of them, or drop stream",
                field="response_format",
            )
        speech_request = SpeechRequest.parse(fields)
        try:
            check_request(speech_request, caps)
        except SpeechRequestError as exc:
            field = "voice" if "voice" in exc.message else exc.field
            raise SpeechRequestError(exc.message, field=field) from None
        omni = model.omni
        if not streaming:
            result = await run_on_model(
                state, model, request, lambda job: omni.speak(job.payload), payload=speech_request
            )
            headers = {
                "x-omni-seed": str(result.metadata.get("seed")),
                "x-omni-sample-rate": str(result.audio.sample_rate),
            }
            for key, value in (result.metadata.get("usage") or {}).items():
                headers[f"x-omni-{key.replace('_', '-')}"] = str(value)
            return Response(result.data, media_type=result.content_type, headers=headers)
        return await _stream_speech(state, model, request, speech_request, sse)

    # -- chat -----------------------------------------------------------------------------

    @app.post(
        CHAT,
        summary="Chat with a multi-stage model",
        response_model=ChatCompletion,
        responses={
            **ERRORS,
            200: {
                "description": "The answer: text, and audio when modalities asks for it (base64 in the message); "
                "with stream, server-sent events: text pieces, then audio chunks (base64 pcm16), then [DONE].",
                "content": {"application/json": {}, "text/event-stream": {}},
            },
        },
    )
    async def chat_completions(body: ChatCompletionBody, request: Request) -> Response:
        """An answer to a conversation in text and, with `modalities` ["text", "audio"], speech,
        made by the model's stages in turn (a text-only request stops before the speech stages)."""
        from omni_core.server import chat

        model = table.for_route(body.model, CHAT)
        _note(request, model=model.name)
        assert model.omni is not None
        topology = model.omni.pipeline.resolved.topology
        messages = chat.conversation(model, body)
        outputs = chat.outputs_asked(model, body)
        params = chat.stage_params(topology.entry.name, topology.names, body, model.voice_stage)
        audio_format = body.audio.format if body.audio is not None else "wav"
        omni = model.omni
        # a stage restarting after a fault is waited for (bounded) inside submit: off the event loop
        stream = await asyncio.to_thread(omni.stream, messages, params=params, outputs=outputs)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Any] = asyncio.Queue()
        chat.pump(stream, loop, events)
        deadline = time.monotonic() + config.request_timeout_s
        started = time.perf_counter()

        async def next_event(watch_hangup: bool) -> Any:
            """The next chunk (or chat.END); the request's error raised; a hang-up or the
            deadline cancels it everywhere it still runs."""
            getter = asyncio.ensure_future(events.get())

            def stop(reason: str) -> None:
                getter.cancel()
                stream.cancel()

            await _wait_for_model(
                {getter}, request, deadline, stop, deadline_s=config.request_timeout_s, watch_hangup=watch_hangup
            )
            event = getter.result()
            if isinstance(event, OmniError):
                raise event
            if isinstance(event, BaseException):
                raise _model_failure(model, event) from event
            return event

        if not body.stream:
            text: list[str] = []
            audio: list[Any] = []
            try:
                while (event := await next_event(watch_hangup=True)) is not chat.END:
                    if event.modality == "text":
                        text.extend(chat.text_piece(model, item) for item in event.items)
                    elif event.modality == "audio":
                        audio.append(chat.audio_chunk(model, event.items))
            finally:
                stream.cancel()  # a no-op once it ended; else (a bad item, a hang-up) it stops the stages
                _note(request, run_s=time.perf_counter() - started)
            answer = "".join(text)
            sound = None
            if "audio" in outputs:
                from omni_core.speech.audio import Audio

                whole = Audio.concatenate(audio) if audio else chat.audio_chunk(model, [])
                sound = ChatAudio(
                    id=f"audio_{stream.request_id}_{uuid.uuid4().hex[:8]}",
                    data=chat.audio_b64(whole, audio_format),
                    expires_at=chat.expires_at(),
                    transcript=answer,
                    sample_rate=whole.sample_rate,
                )
            message = ChatAnswer(content=answer if "text" in outputs else None, audio=sound)
            completion = ChatCompletion(
                id=chat.completion_id(),
                created=int(time.time()),
                model=model.name,
                choices=[ChatChoice(message=message, finish_reason=stream.finish_reason)],
            )
            return JSONResponse(completion.model_dump(mode="json"))

        first = await next_event(watch_hangup=True)  # a failure before the first output is a proper error
        completion_id = chat.completion_id()
        created = int(time.time())
        audio_id = f"audio_{stream.request_id}_{uuid.uuid4().hex[:8]}"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return chat.sse(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model.name,
                    "choices": [choice],
                }
            )

        async def sse_body() -> AsyncIterator[bytes]:
            event = first
            try:
                yield chunk({"role": "assistant", "content": ""})
                while event is not chat.END:
                    if event.modality == "text":
                        piece = "".join(chat.text_piece(model, item) for item in event.items)
                        if piece:  # a token whose text is held back (half a character) sends nothing yet
                            yield chunk({"content": piece})
                    elif event.modality == "audio":
                        data = chat.audio_b64(chat.audio_chunk(model, event.items), "pcm16")
                        yield chunk({"audio": {"id": audio_id, "data": data}})
                    try:
                        event = await next_event(watch_hangup=False)
                    except Exception as exc:  # the answer has started: end it with an error event, log why
                        log.error("chat stream %s failed: %s", _request_id(request), exc, exc_info=exc)
                        message = exc.message if isinstance(exc, OmniError) else "the model failed mid-answer"
                        yield chat.sse({"error": {"message": f"{message}; see the server log", "type": "server_error"}})
                        return
                yield chunk({}, stream.finish_reason)
                yield chat.sse("[DONE]")
            finally:
                stream.cancel()  # a hang-up closes this generator early: stop every stage still on it
                _note(request, run_s=time.perf_counter() - started)

        headers = {"Cache-Control": "no-store"}
        if "audio" in outputs:
            headers["x-omni-sample-rate"] = str(model.outputs.get("audio"))
        return StreamingResponse(sse_body(), media_type="text/event-stream", headers=headers)

    # -- video ----------------------------------------------------------------------------

    video_body_schema = {"$ref": "#/components/schemas/VideoGenerationBody"}

    @app.post(
        VIDEOS,
        summary="Create a video job",
        response_model=VideoJob,
        responses=ERRORS,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": video_body_schema},
                    "multipart/form-data": {"schema": video_body_schema},
                },
            }
        },
    )
    async def create_video(request: Request) -> VideoJob:
        """Queue a video; the answer is a job to poll (`GET /v1/videos/{video_id}`) until it
        is `completed`, then fetch its content."""
        form = await _video_form(request)
        from_form = request.headers.get("content-type", "").startswith(_FORM_TYPES)
        try:
            body = VideoGenerationBody.model_validate(form, strict=not from_form)
        except ValidationError as exc:
            message, param = _validation_message(exc, VideoGenerationBody)
            raise GenerationOptionError(message, field=param) from None
        model = table.for_route(body.model, VIDEOS)  # type: ignore[attr-defined]
        _note(request, model=model.name)
        fields = _generation_fields(body, {"model", "size", "seconds"})
        _video_frames(model, fields, body.seconds)  # type: ignore[attr-defined]
        _limits(state, model, fields, "frame")
        _check_generation(model, fields)
        width, height = model.effective(fields, "width"), model.effective(fields, "height")
        fps = model.effective(fields, "fps") or 1
        frames = model.effective(fields, "num_frames") or 1
        record = state.jobs.new(model.name, fields["prompt"], f"{width}x{height}", f"{frames / fps:g}")
        record.steps = model.effective(fields, "num_inference_steps") or 0
        _start_video(state, model, record, fields)
        return record.view(config.job_ttl_s)

    @app.get(VIDEOS, response_model=VideoJobList, responses=ERRORS, summary="List video jobs")
    async def list_videos() -> VideoJobList:
        """The jobs this server keeps (finished ones for --job-ttl, at most --max-jobs), newest first."""
        return VideoJobList(data=[r.view(config.job_ttl_s) for r in state.jobs.all()])

    @app.get(VIDEOS + "/{video_id}", response_model=VideoJob, responses=ERRORS, summary="A video job")
    async def get_video(video_id: str) -> VideoJob:
        """The job's status and progress; `expires_at` once it has finished."""
        return _video(state, video_id).view(config.job_ttl_s)

    @app.get(
        VIDEOS + "/{video_id}/content",
        summary="A finished video's MP4",
        response_class=Response,
        responses={**ERRORS, 200: {"content": {"video/mp4": {}}, "description": "The MP4 (H.264)."}},
    )
    async def video_content(video_id: str) -> Response:
        """The MP4 of a `completed` job (an error until then)."""
        record = _video(state, video_id)
        if record.status != "completed" or record.path is None or not record.path.is_file():
            why = f"failed: {record.error.message}" if record.error is not None else f"is {record.status}"
            raise GenerationOptionError(
                f"video {video_id} {why}; its content is there once GET /v1/videos/{video_id} says completed",
                field="video_id",
            )
        data = await asyncio.to_thread(record.path.read_bytes)
        return Response(data, media_type="video/mp4")

    @app.delete(VIDEOS + "/{video_id}", response_model=VideoDeleted, responses=ERRORS, summary="Delete a video job")
    async def delete_video(video_id: str) -> VideoDeleted:
        """Remove the job and its file, cancelling it first if it is queued or running."""
        _video(state, video_id)
        state.jobs.remove(video_id)
        return VideoDeleted(id=video_id)

    app.openapi = lambda: _openapi(app, config.api_key is not None)  # type: ignore[method-assign]
    app.add_middleware(Gate, state=state)
    return app


def _images(result: Any) -> list[ImageData]:
    from omni_core.generation.media import png_bytes

    meta = result.metadata.to_dict()
    seed = result.seed
    return [
        ImageData(b64_json=base64.b64encode(png_bytes(image.pixels, meta)).decode("ascii"), seed=seed)
        for image in result.images
    ]


async def _stream_speech(
    state: ServerState, model: Model, request: Request, speech_request: Any, sse: bool
) -> Response:
    """Chunks as the model makes them: raw audio (a WAV header first for wav) or SSE events. A
    hang-up stops synthesis at the next chunk; the first chunk's failure is a proper error."""
    from omni_core.speech.audio import encode, wav_stream_header

    assert model.omni is not None and model.worker is not None
    omni = model.omni
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[Any] = asyncio.Queue()
    done = object()

    def run(job: Job) -> int:
        count = 0
        stream = omni.stream_speech(job.payload)
        for audio in stream:
            loop.call_soon_threadsafe(chunks.put_nowait, audio)
            count += 1
        loop.call_soon_threadsafe(chunks.put_nowait, done)
        return count

    job = Job(run=run, loop=loop, future=loop.create_future(), payload=speech_request)
    model.worker.submit(job)
    _note(request, model=model.name)
    deadline = time.monotonic() + state.config.request_timeout_s

    async def next_chunk(watch_hangup: bool = False) -> Any:
        getter = asyncio.ensure_future(chunks.get())

        def stop(reason: str) -> None:
            getter.cancel()
            job.token.cancel(reason)

        # before the answer starts, a hang-up is ours to see (then the response watches for it)
        finished = await _wait_for_model(
            {getter, job.future},
            request,
            deadline,
            stop,
            deadline_s=state.config.request_timeout_s,
            watch_hangup=watch_hangup,
            before="the stream started",
        )
        if getter in finished:
            return getter.result()
        getter.cancel()
        error = job.future.exception()
        if error is not None and not isinstance(error, OmniError):
            raise _model_failure(model, error) from error
        if error is not None:
            raise error
        return chunks.get_nowait() if not chunks.empty() else done

    first = await next_chunk(watch_hangup=True)  # errors before the first byte are proper HTTP errors

    async def body() -> AsyncIterator[bytes]:
        chunk = first
        try:
            if not sse and speech_request.response_format == "wav" and chunk is not done:
                yield wav_stream_header(chunk.sample_rate, chunk.channels)
            while chunk is not done:
                pcm = encode(chunk, "pcm")
                if sse:
                    event = {"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode("ascii")}
                    yield f"data: {json.dumps(event)}\n\n".encode()
                else:
                    yield pcm
                try:
                    chunk = await next_chunk()
                except Exception as exc:  # the answer has started: end it, log the cause
                    log.error("stream %s failed: %s", _request_id(request), exc, exc_info=exc)
                    if sse:
                        error = {
                            "type": "error",
                            "error": {"message": "synthesis failed mid-stream; see the server log"},
                        }
                        yield f"data: {json.dumps(error)}\n\n".encode()
                    return
            if sse:
                yield f"data: {json.dumps({'type': 'speech.audio.done'})}\n\n".encode()
        finally:
            # a hang-up closes this generator early: stop the synthesis too
            job.token.cancel("the client disconnected")
            _note(request, queue_s=job.queue_seconds, run_s=job.run_seconds)

    media = "text/event-stream" if sse else ("audio/wav" if speech_request.response_format == "wav" else "audio/pcm")
    headers = {"x-omni-sample-rate": str(getattr(first, "sample_rate", "")), "Cache-Control": "no-store"}
    return StreamingResponse(body(), media_type=media, headers=headers)


# -- video helpers --------------------------------------------------------------------------------


_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


async def _video_form(request: Request) -> dict[str, Any]:
    """The body as a dict, from JSON or a multipart form (fields as text, JSON for ``extra``;
    an uploaded ``input_reference`` image for image-to-video is saved and passed as ``image``)."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(_FORM_TYPES):
        try:
            form = await request.form()
        except Exception as exc:
            raise GenerationOptionError(f"the form cannot be read: {exc}") from None
        data: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key == "input_reference":
                raise GenerationOptionError(
                    "input_reference uploads are not taken by this server yet; send a text-to-video request",
                    field="input_reference",
                )
            if not isinstance(value, str):
                continue
            if key == "extra":
                try:
                    data[key] = json.loads(value)
                except ValueError:
                    raise GenerationOptionError("extra must be a JSON object", field="extra") from None
            else:
                data[key] = value
        return data
    raw = await request.body()
    try:
        data = json.loads(raw or b"null")
    except ValueError:
        raise GenerationOptionError("the body is not valid JSON; send a JSON object") from None
    if not isinstance(data, dict):
        raise GenerationOptionError("the body must be a JSON object")
    return data


def _video_frames(model: Model, fields: dict[str, Any], seconds: float | None) -> None:
    """``seconds`` as a frame count the model takes (rounded up), unless num_frames is given."""
    profile = model.profile
    if seconds is None or "num_frames" in fields or profile is None:
        return
    fps = model.effective(fields, "fps") or 1
    wanted = max(1, math.ceil(seconds * fps))
    step, offset = profile.frames_step, profile.frames_offset
    k = max(0, math.ceil((wanted - offset) / step))
    fields["num_frames"] = step * k + offset if step * k + offset >= 1 else step + offset


def _video(state: ServerState, video_id: str) -> VideoRecord:
    from omni_core.errors import UnknownExtensionError

    record = state.jobs.get(video_id)
    if record is None:
        raise UnknownExtensionError(
            f"no video job {video_id!r} (finished jobs are kept {state.config.job_ttl_s:g} s)", field="video_id"
        )
    return record


def _start_video(state: ServerState, model: Model, record: VideoRecord, fields: dict[str, Any]) -> None:
    assert model.omni is not None and model.worker is not None
    omni = model.omni
    loop = asyncio.get_running_loop()

    def started(job: Job) -> None:
        if record.status == "queued":
            record.status, record.progress = "in_progress", 1

    def run(job: Job) -> None:
        result = omni.generate(job.payload)
        assert record.path is not None
        result.save(record.path, "mp4")  # written to a temporary name, then renamed

    job = Job(run=run, loop=loop, future=loop.create_future(), payload=fields, on_start=started)
    record.job = job
    model.worker.submit(job)

    async def watch() -> None:
        timeout = state.config.request_timeout_s
        try:
            await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except TimeoutError:
            job.token.cancel("the job ran past the server's deadline (--request-timeout)")
            record.finish("failed", VideoError(code="timeout", message=f"the job ran past {timeout:g} s"))
        except RequestCancelled as exc:
            record.finish("cancelled", VideoError(code="cancelled", message=exc.message))
        except OmniError as exc:
            code = "invalid_request" if exc.http_status < 500 else "generation_failed"
            log.error("video %s failed: %s", record.id, exc.message, exc_info=exc)
            message = exc.message if exc.http_status < 500 else "generation failed; the server log has the cause"
            record.finish("failed", VideoError(code=code, message=message))
        except Exception as exc:
            log.error("video %s failed: %s", record.id, exc, exc_info=exc)
            record.finish(
                "failed", VideoError(code="generation_failed", message="generation failed; see the server log")
            )
        else:
            record.finish("completed")

    task = asyncio.ensure_future(watch())
    state.video_tasks.add(task)
    task.add_done_callback(state.video_tasks.discard)


def _openapi(app: FastAPI, api_key: bool) -> dict[str, Any]:
    """FastAPI's schema without its 422 (this server answers 400 in :class:`ErrorResponse`),
    with the Bearer key on the /v1/ routes: required when the server has one, else optional."""
    from fastapi.openapi.utils import get_openapi

    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, description=app.description, routes=app.routes
    )
    for route, path in schema.get("paths", {}).items():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
            if route.startswith("/v1/"):
                operation["security"] = [{"bearerAuth": []}] if api_key else [{}, {"bearerAuth": []}]
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearerAuth": {"type": "http", "scheme": "bearer", "description": "omni serve --api-key (or OMNI_API_KEY)"}
    }
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    components["VideoGenerationBody"] = VideoGenerationBody.model_json_schema(
        ref_template="#/components/schemas/{model}"
    )
    app.openapi_schema = schema
    return schema
