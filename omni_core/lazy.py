"""Lazy ``module:attribute`` references: heavy objects are imported on first use, and timed."""

from __future__ import annotations

import importlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

from omni_core.errors import LazyImportError, ReferenceFormatError
from omni_core.guard import contained, describe
from omni_core.text import shell_arg

_REF_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")

#: Wall time of every resolution made in this process, keyed by reference. The plugin host
#: persists these so ``omni plugins show`` can report them without importing anything.
IMPORT_TIMINGS: dict[str, float] = {}


def check_ref(ref: str) -> str:
    """Return ``ref`` if it is a valid ``package.module:attr`` reference, else raise."""
    if not isinstance(ref, str) or not _REF_RE.match(ref):
        raise ReferenceFormatError(
            f"invalid reference {ref!r}: expected 'package.module:attribute', "
            "for example 'omni_plugin_cpu.platform:CpuPlatform'"
        )
    return ref


@dataclass
class LazyRef:
    """A reference to an object that is imported only when :meth:`resolve` is first called."""

    ref: str
    owner: str = ""  #: the plugin that registered it, for error messages
    _value: Any = field(default=None, init=False, repr=False)
    _resolved: bool = field(default=False, init=False, repr=False)
    load_seconds: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        check_ref(self.ref)

    @property
    def module(self) -> str:
        return self.ref.partition(":")[0]

    @property
    def attribute(self) -> str:
        return self.ref.partition(":")[2]

    @property
    def resolved(self) -> bool:
        return self._resolved

    def resolve(self) -> Any:
        """Import the module and return the attribute. Raises :class:`LazyImportError`."""
        if self._resolved:
            return self._value
        start = time.perf_counter()
        who = f" (registered by plugin {self.owner!r})" if self.owner else ""
        disable = f"omni plugins disable {shell_arg(self.owner)}" if self.owner else "omni plugins disable NAME"
        try:
            with contained():  # plugin code: its sys.exit() is a failed import, not omni's end
                obj: Any = importlib.import_module(self.module)
        except Exception as exc:
            raise LazyImportError(
                f"cannot import {self.module!r} for {self.ref!r}{who}: "
                f"{describe(exc)}. Install what the plugin needs "
                f"(its README and `pip show` list it) or disable it with `{disable}`.",
                name=self.ref,
                plugin=self.owner or None,
            ) from exc
        for part in self.attribute.split("."):
            try:
                with contained():  # a module __getattr__ is plugin code too
                    obj = getattr(obj, part)
            except AttributeError as exc:
                raise LazyImportError(
                    f"{self.module!r} has no attribute {self.attribute!r}, "
                    f"referenced as {self.ref!r}{who}; the plugin's metadata is out of date "
                    "with its code: fix the reference or reinstall the plugin.",
                    name=self.ref,
                    plugin=self.owner or None,
                ) from exc
            except Exception as exc:
                raise LazyImportError(
                    f"looking up {self.attribute!r} in {self.module!r} for {self.ref!r}{who} raised "
                    f"{describe(exc)}; fix the plugin or disable it with `{disable}`.",
                    name=self.ref,
                    plugin=self.owner or None,
                ) from exc
        self.load_seconds = time.perf_counter() - start
        IMPORT_TIMINGS.setdefault(self.ref, self.load_seconds)
        self._value = obj
        self._resolved = True
        return obj
