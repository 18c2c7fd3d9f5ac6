"""Showing text that comes from plugins: names, descriptions, reasons, fix hints, help.

A plugin controls its entry-point name, its manifest and its exception messages. Printed raw,
an escape sequence in any of them could recolour the terminal, retitle the window, hide a line
behind a carriage return or fake a fix hint. Every command that prints plugin text passes it
through :func:`printable`; every fix hint that names a plugin quotes the name with
:func:`shell_arg`, so the hint is safe to paste.

Standard library only: imported by ``omni plugins list``, which must start fast.
"""

from __future__ import annotations

import re
import shlex

#: C0 controls but newline and tab, DEL, and the C1 controls (U+0080-U+009F: CSI, OSC, ...)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: the same plus newline and tab, for one-line fields (names, table cells)
_CONTROL_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or f"\\x{ord(char):02x}"


def printable(text: object, *, one_line: bool = False) -> str:
    """``text`` with every terminal control character shown as an escape (``ESC`` as ``\\x1b``).

    Newlines and tabs are kept unless ``one_line`` (names, table cells), where they are escaped
    too. Everything else, non-ASCII letters included, is left as it is.
    """
    s = text if isinstance(text, str) else str(text)
    return (_CONTROL_ONE_LINE if one_line else _CONTROL).sub(_escape, s)


def shell_arg(text: str) -> str:
    """``text`` quoted as one shell word, so a fix hint like ``omni plugins disable NAME`` can
    be pasted as shown: ``evil;rm -rf`` becomes ``'evil;rm -rf'``. A name holding control
    characters gets ANSI-C quoting (``$'evil\\x1b[31m'``, bash and zsh), which both shows the
    escapes and reproduces the exact name."""
    if not _CONTROL_ONE_LINE.search(text):
        return shlex.quote(text)
    body = "".join(
        f"\\x{ord(c):02x}" if _CONTROL_ONE_LINE.match(c) else "\\\\" if c == "\\" else "\\'" if c == "'" else c
        for c in text
    )
    return f"$'{body}'"
