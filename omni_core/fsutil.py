"""Writing files and directories so that nothing is ever half-written or lost.

Every file omni writes (outputs, the user config, caches, tiny checkpoints) goes through here:

* :func:`atomic_write` / :func:`atomic_write_text` write to a temporary name beside the target
  and rename it into place, so a failed or killed run leaves the old file (or none), never a
  truncated one.
* :func:`atomic_output` is the same as a context manager, for writers that want a path.
* :func:`replace_dir` builds a new directory beside the old one and swaps it in at the end; an
  interrupted build leaves the old directory intact, and :func:`sweep_scratch` removes the
  scratch left by a killed run.
* :func:`file_lock` serialises read-modify-write cycles and first-use builds across processes.

Standard library only: this module is imported by commands that must start fast.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import FileWriteError as FileWriteError

#: prefix of every scratch name this module makes, so a later run can recognise and sweep them
SCRATCH_PREFIX = ".omni-tmp-"
#: scratch older than this is left behind by a dead run (a live build finishes much sooner)
STALE_SCRATCH_SECONDS = 3600.0


def _scratch_name(target: Path) -> str:
    # the pid comes first so that a later run can tell a dead writer's scratch from a live one's
    return f"{SCRATCH_PREFIX}{os.getpid()}-{target.name}-"


def _owner_pid(name: str) -> int | None:
    pid, sep, _ = name[len(SCRATCH_PREFIX) :].partition("-")
    return int(pid) if sep and pid.isdigit() else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, but someone else's
        return True
    return True


def _os_problem(exc: OSError) -> tuple[str, str]:
    """(what went wrong, what to do) for an OSError met while writing."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "permission denied (read-only place?)", "choose a writable location"
    if exc.errno == errno.EISDIR:
        return "it is a directory", "give a file name"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a file is in the way where a directory should be", "remove it or choose another location"
    if exc.errno == errno.ENOENT:
        return "its directory does not exist", "create it first"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the device", "free some space"
    if exc.errno == errno.EFBIG:
        return "file too large for this place (a file size limit?)", "free some space or choose another place"
    return str(exc.strerror or exc), "choose another location"


def describe_os_error(exc: OSError, path: Path | str) -> str:
    """One sentence saying why ``path`` could not be written, and what to do."""
    problem, fix = _os_problem(exc)
    return f"cannot write {path}: {problem}; {fix}"


def check_writable_dir(directory: Path | str, target: Path | str | None = None) -> None:
    """Raise :class:`FileWriteError` unless a file can be created in ``directory`` (named as
    ``target`` in the message, when given). Checked by creating and removing a scratch file:
    permission bits alone do not tell (root, read-only mounts, ACLs). Commands call it before
    loading a model, so a bad output place fails in a second, not after the work."""
    directory = Path(directory)
    shown = Path(target) if target is not None else directory
    if not directory.is_dir():
        # the nearest existing ancestor says which: a file in the way, or a missing directory
        for parent in (directory, *directory.parents):
            if parent.exists() or parent.is_symlink():
                code = errno.ENOENT if parent.is_dir() else errno.ENOTDIR
                raise FileWriteError(describe_os_error(OSError(code, os.strerror(code)), shown))
        raise FileWriteError(describe_os_error(OSError(errno.ENOENT, os.strerror(errno.ENOENT)), shown))
    try:
        fd, name = tempfile.mkstemp(prefix=_scratch_name(shown), dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise FileWriteError(describe_os_error(exc, shown)) from None


@contextlib.contextmanager
def atomic_output(target: Path | str, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it is renamed to ``target``.

    On any failure the temporary file is removed and ``target`` is untouched. With
    ``overwrite=False`` an existing ``target`` is never replaced (the rename is a hard link,
    which fails if the name is taken), so two writers cannot silently overwrite each other.
    Raises :class:`FileWriteError` when the place cannot be written.
    """
    target = Path(target)
    if target.is_symlink():  # write through a link, as a plain open() would, not over it
        target = Path(os.path.realpath(target))
    if target.is_dir():
        raise FileWriteError(describe_os_error(OSError(errno.EISDIR, "is a directory"), target))
    sweep_scratch(target.parent, name=target.name)  # what a killed writer of this file left
    try:
        # the same suffix, for encoders that pick the container from the name (ffmpeg)
        fd, tmp_name = tempfile.mkstemp(prefix=_scratch_name(target), suffix=target.suffix, dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise FileWriteError(describe_os_error(exc, target)) from None
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise FileWriteError(f"{target} already exists; omni does not overwrite it") from None
    except OSError as exc:
        if isinstance(exc, FileWriteError):
            raise
        raise FileWriteError(describe_os_error(exc, target)) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def atomic_write(target: Path | str, data: bytes, *, overwrite: bool = True, durable: bool = True) -> Path:
    """Write ``data`` to ``target`` through a temporary file and a rename.

    ``durable=False`` skips the ``fsync``: the file still never appears half-written to a
    process, and survives the writer's own death, but not a power cut. For small, frequent
    bookkeeping (the plugin-loading breadcrumb) where an fsync would cost more than the work.
    """
    with atomic_output(target, overwrite=overwrite) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
    return Path(target)


def atomic_write_text(target: Path | str, text: str, *, overwrite: bool = True, durable: bool = True) -> Path:
    return atomic_write(target, text.encode("utf-8"), overwrite=overwrite, durable=durable)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sweep_scratch(directory: Path, older_than: float = STALE_SCRATCH_SECONDS, *, name: str | None = None) -> list[Path]:
    """Remove scratch files and directories this module left in ``directory`` by a run that
    is gone: its process no longer exists (killed), or it is more than ``older_than`` seconds
    old. With ``name``, only the scratch of that target name. Returns what was removed; never
    raises. A live process's scratch is never touched, so concurrent writers are safe."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(SCRATCH_PREFIX):
            continue
        pid = _owner_pid(entry.name)
        if name is not None and (pid is None or not entry.name.startswith(f"{SCRATCH_PREFIX}{pid}-{name}-")):
            continue
        try:
            dead = pid is not None and pid != os.getpid() and not _pid_alive(pid)
            if not dead and now - entry.lstat().st_mtime < older_than:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
        except OSError:
            continue
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the system cannot, and the caller falls back to two renames."""
    if not hasattr(os, "sched_getaffinity"):  # cheap "is this Linux" check
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return bool(rc == 0)


def replace_dir(target: Path, build: Callable[[Path], None], *, replace: bool = False) -> Path:
    """Build a directory with ``build(scratch)`` beside ``target`` and move it into place.

    Without ``replace`` an existing non-empty ``target`` is an error. With it, the old
    directory is swapped out only after ``build`` succeeded; an interrupted or failed build
    leaves the old one exactly as it was. Stale scratch of killed runs is swept first.
    """
    target = Path(target)
    ensure_dir(target.parent)
    sweep_scratch(target.parent)
    if target.exists() and not target.is_dir():
        raise FileWriteError(f"{target} exists and is a file, not a directory; choose another path")
    if target.is_dir() and any(target.iterdir()) and not replace:
        raise FileWriteError(f"{target} exists and is not empty; choose another directory or pass --force")
    try:
        scratch = Path(tempfile.mkdtemp(prefix=_scratch_name(target), dir=target.parent))
        os.chmod(scratch, 0o777 & ~_umask())  # mkdtemp's 0700 would outlive the rename
    except OSError as exc:
        raise FileWriteError(describe_os_error(exc, target)) from None
    old: Path | None = None
    try:
        build(scratch)
        if target.is_dir() and _exchange(scratch, target):
            # one atomic step: no moment exists where target is missing; the old one is now scratch
            old, scratch = scratch, target
        else:
            if target.exists():
                old = Path(tempfile.mkdtemp(prefix=_scratch_name(target) + "old-", dir=target.parent))
                os.rmdir(old)
                os.rename(target, old)
            os.rename(scratch, target)
    except BaseException as exc:
        if old is not None and not target.exists():
            os.rename(old, target)  # put the old one back
            old = None
        if scratch != target:
            shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(exc, OSError) and not isinstance(exc, FileWriteError):
            raise FileWriteError(describe_os_error(exc, target)) from None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def ensure_dir(path: Path | str, fix: str = "") -> Path:
    """Create directory ``path`` if needed and check that it can be written to.

    Raises :class:`FileWriteError` naming the path, why, and ``fix`` (e.g. "set
    OMNI_CACHE_DIR to a writable directory"; default: the generic fix for the cause) for a
    file in the way or an unwritable place.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied")
    except OSError as exc:
        if isinstance(exc, FileExistsError) or exc.errno == errno.ENOTDIR:
            problem, default_fix = "it (or a parent) is a file, not a directory", "remove it or choose another location"
        else:
            problem, default_fix = _os_problem(exc)
        raise FileWriteError(f"cannot use directory {path}: {problem}; {fix or default_fix}") from None
    return path


@contextlib.contextmanager
def file_lock(path: Path, timeout: float = 600.0) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if needed) across processes.

    Used for read-modify-write of shared files and for building a shared cache entry once.
    A lock held by a process that died is released by the kernel. Where locking is not
    available (no ``fcntl``, or an unwritable directory) the body runs unlocked: a cache that
    cannot be locked is one that cannot be written either, and that is reported by the write.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise FileWriteError(
                        f"another omni process holds {path} for more than {timeout:.0f} s; "
                        "wait for it to finish, or remove the file if no omni process is running"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock
