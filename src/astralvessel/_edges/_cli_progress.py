"""The CLI's progress line: a call running past a second says so on stderr, if a terminal."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

__all__ = ["progress"]

#: How long a call runs before the line appears, and how often it is redrawn.
AFTER_SECONDS = 1.0


@contextlib.contextmanager
def progress(tool: str, stream: TextIO | None = None) -> Iterator[None]:
    """While the block runs past ``AFTER_SECONDS``, keep ``tool running... Ns`` on ``stream``.

    Only when ``stream`` (stderr by default) is a terminal: a pipe or a file gets
    nothing, so scripts reading stderr see only errors. The line is erased at the end.
    """
    out = sys.stderr if stream is None else stream
    if not out.isatty():
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def draw() -> None:
        shown = False
        while not done.wait(AFTER_SECONDS if not shown else 0.5):
            shown = True
            out.write(f"\r\x1b[Kastralvessel: {tool} running... {time.monotonic() - started:.0f}s")
            out.flush()
        if shown:
            out.write("\r\x1b[K")
            out.flush()

    drawer = threading.Thread(target=draw, name="astralvessel-progress", daemon=True)
    drawer.start()
    try:
        yield
    finally:
        done.set()
        drawer.join()
