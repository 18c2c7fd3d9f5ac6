"""``omni serve``: every model omni runs, behind an OpenAI-compatible HTTP API.

The layout follows the request's path through the server:

* :mod:`~omni_core.server.config`: :class:`ServerConfig`, every limit and switch (``omni serve --help``);
* :mod:`~omni_core.server.schemas`: the request and response bodies (OpenAI shapes; the
  generation fields are :class:`~omni_core.generation.request.GenerationRequest`'s own);
* :mod:`~omni_core.server.app`: the FastAPI app: routes, auth, limits, errors, request log;
* :mod:`~omni_core.server.models`: the served models, each loaded once, each with a
  :class:`~omni_core.server.worker.ModelWorker`;
* :mod:`~omni_core.server.worker`: a bounded queue and one thread per model, where requests
  that can share a pipeline call are batched, deadlines and hang-ups cancel work;
* :mod:`~omni_core.server.jobs`: asynchronous video jobs, kept for a bounded time and count;
* :mod:`~omni_core.server.metrics`: the Prometheus metrics;
* :mod:`~omni_core.server.runner`: binding the port, uvicorn, SIGTERM drain.

A new kind of model (chat, multi-stage) adds a route and a kind of job, never a second server.
Importing this package is cheap; FastAPI and uvicorn are imported by the modules that use them
(the ``serve`` extra: ``pip install 'omni-core[serve]'``).
"""

from __future__ import annotations

from omni_core.server.config import ModelSource, ServerConfig

__all__ = ["SERVE_PACKAGES", "ModelSource", "ServerConfig"]

#: the distributions behind ``omni serve`` (the ``serve`` extra); ``omni doctor`` reports them
SERVE_PACKAGES = ("fastapi", "uvicorn", "prometheus-client", "python-multipart", "numpy", "pillow")
