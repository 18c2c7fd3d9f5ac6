"""Video jobs: ``POST /v1/videos`` answers at once with a job; the client polls it and fetches
the MP4 when it is ``completed``.

A job's life: ``queued`` (in its model's queue) -> ``in_progress`` (running) -> ``completed``,
``failed`` or ``cancelled`` (``DELETE`` while queued or running, or the server's deadline). A
finished job and its file are kept for ``job_ttl_s`` and at most ``max_jobs`` of them (the
oldest go first); files live in one private directory that the server removes when it stops.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from omni_core.server.schemas import VideoError, VideoJob, VideoStatus
from omni_core.server.worker import Job

FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


@dataclass
class VideoRecord:
    id: str
    model: str
    prompt: str
    size: str
    seconds: str
    created_at: int
    status: VideoStatus = "queued"
    progress: int = 0
    completed_at: int | None = None
    error: VideoError | None = None
    path: Path | None = None
    job: Job | None = None
    #: denoising steps the job runs (its progress counts the steps it has checked in)
    steps: int = 0

    def current_progress(self) -> int:
        if self.status != "in_progress" or self.job is None or not self.steps:
            return self.progress
        return max(self.progress, min(99, round(100 * self.job.token.checks / self.steps)))

    def view(self, ttl: float) -> VideoJob:
        expires = self.completed_at + int(ttl) if self.completed_at is not None else None
        return VideoJob(
            id=self.id,
            model=self.model,
            status=self.status,
            progress=self.current_progress(),
            created_at=self.created_at,
            completed_at=self.completed_at,
            expires_at=expires,
            size=self.size,
            seconds=self.seconds,
            prompt=self.prompt,
            error=self.error,
        )

    def finish(self, status: VideoStatus, error: VideoError | None = None) -> None:
        if self.status in FINISHED:
            return
        self.status = status
        self.error = error
        self.completed_at = int(time.time())
        if status == "completed":
            self.progress = 100


class VideoJobs:
    def __init__(self, ttl_s: float, max_jobs: int) -> None:
        self.ttl_s = ttl_s
        self.max_jobs = max_jobs
        self._jobs: dict[str, VideoRecord] = {}
        self._lock = threading.Lock()
        self.directory = Path(tempfile.mkdtemp(prefix="omni-serve-videos-"))

    def new(self, model: str, prompt: str, size: str, seconds: str) -> VideoRecord:
        record = VideoRecord(
            id=f"video_{uuid.uuid4().hex}",
            model=model,
            prompt=prompt,
            size=size,
            seconds=seconds,
            created_at=int(time.time()),
        )
        record.path = self.directory / f"{record.id}.mp4"
        with self._lock:
            self._jobs[record.id] = record
        self.sweep()
        return record

    def get(self, job_id: str) -> VideoRecord | None:
        self.sweep()
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> list[VideoRecord]:
        self.sweep()
        with self._lock:
            return sorted(self._jobs.values(), key=lambda r: r.created_at, reverse=True)

    def remove(self, job_id: str) -> VideoRecord | None:
        with self._lock:
            record = self._jobs.pop(job_id, None)
        if record is not None:
            if record.job is not None and record.status not in FINISHED:
                record.job.token.cancel("the job was deleted")
                record.finish("cancelled", VideoError(code="cancelled", message="the job was deleted"))
            _unlink(record.path)
        return record

    def sweep(self) -> None:
        """Drop finished jobs past their time, then the oldest finished beyond the count."""
        now = time.time()
        with self._lock:
            finished = sorted(
                (r for r in self._jobs.values() if r.status in FINISHED and r.completed_at is not None),
                key=lambda r: r.completed_at or 0,
            )
            expired = [r for r in finished if now - (r.completed_at or now) > self.ttl_s]
            keep = [r for r in finished if r not in expired]
            expired += keep[: max(0, len(keep) - self.max_jobs)]
            for record in expired:
                self._jobs.pop(record.id, None)
        for record in expired:
            _unlink(record.path)

    def close(self) -> None:
        with self._lock:
            for record in self._jobs.values():
                if record.job is not None and record.status not in FINISHED:
                    record.job.token.cancel("the server shut down")
            self._jobs.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


def _unlink(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)
