"""Make untrusted text safe to show on an operator's terminal.

A tool's output is the model's (or a web page's, or a file name's) text. Written
to a terminal unchanged, its control sequences act on the terminal: OSC 52
writes the clipboard, OSC 0 the window title, CSI 2J clears the screen under a
forged line, a carriage return overwrites what was printed. ``for_terminal``
spells every such character out (``\\x1b``, ``\\u202e``) and keeps newline and
tab, which only lay text out. It is a pure function; the CLI applies it to every
result it prints as text (``--json`` prints the exact text instead).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["for_terminal"]

#: C0 controls but newline and tab, DEL, and C1 controls (some terminals read
#: U+009B as CSI even in UTF-8).
_CONTROLS = [*(c for c in range(0x20) if chr(c) not in "\n\t"), 0x7F, *range(0x80, 0xA0)]
#: Bidirectional overrides and isolates: they reorder what the operator reads.
_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]

_ESCAPES: Mapping[int, str] = {
    **{c: f"\\x{c:02x}" for c in _CONTROLS},
    **{c: f"\\u{c:04x}" for c in _BIDI},
}


def for_terminal(text: str) -> str:
    """``text`` with every control character but newline and tab written as an escape."""
    return text.translate(_ESCAPES)
