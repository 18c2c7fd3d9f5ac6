"""The server's Prometheus metrics (``GET /metrics``), in a registry of their own.

Labels are bounded sets (endpoint templates, served model names, status codes, error types):
never a request id, a prompt or a job id, so a busy server's series count stays flat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class _Queues(Collector):
    """Queue depth and running requests per model, read at scrape time."""

    def __init__(self, depths: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self._depths = depths

    def collect(self) -> Iterator[Any]:
        waiting = GaugeMetricFamily("omni_queue_depth", "Requests waiting for a model.", labels=["model"])
        running = GaugeMetricFamily("omni_requests_running", "Requests a model is running.", labels=["model"])
        for model, (depth, busy) in self._depths().items():
            waiting.add_metric([model], depth)
            running.add_metric([model], busy)
        yield waiting
        yield running


class Metrics:
    def __init__(self, depths: Callable[[], dict[str, tuple[int, int]]]) -> None:
        # a "_created" timestamp per series doubles the series count and tells nothing here
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "omni_requests", "HTTP requests answered.", ["endpoint", "model", "status"], registry=self.registry
        )
        self.errors = Counter(
            "omni_request_errors",
            "Requests that failed, by error type.",
            ["endpoint", "model", "type"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "omni_request_seconds",
            "Time from arrival to the last byte of the answer.",
            ["endpoint", "model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_time = Histogram(
            "omni_queue_seconds",
            "Time a request waited for its model.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.run_time = Histogram(
            "omni_run_seconds",
            "Time a model ran a request (its whole batch).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "omni_batch_size",
            "Requests run together in one model call.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Queues(depths))

    def render(self) -> bytes:
        return generate_latest(self.registry)
