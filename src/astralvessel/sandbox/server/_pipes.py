"""A running call's pipes, in the sandbox server (stdlib only, Python 3.8+).

The request's stdin goes in as the pipe takes it; each output pipe's bytes go to
the host as ``out`` frames, bounded by what the call may return (``Call.take``).
One reader serves both output pipes, chosen by the stream's row in ``PIPES`` (the
habit of h11's body readers). Every pipe is non-blocking, and a read takes at
most ``16 * READ_SIZE`` bytes before the loop serves the others.
"""

from __future__ import annotations

import os

from ._lean import suppress

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._calls import Call
    from ._lean import Selector

__all__ = ["PIPES", "READ_SIZE", "close", "close_stdin", "feed_stdin", "pump"]

READ_SIZE = 65536
#: A call's output pipes by the stream each carries: the ``Spawned`` attribute holding the
#: pipe, the ``Call`` flag saying it is open, and the ``out`` frame's header (a tool
#: call's merged text and a detached process's log are stdout).
PIPES = {
    "stdout": ("output", "output_open", {"type": "out"}),
    "stderr": ("errors", "errors_open", {"type": "out", "stream": "stderr"}),
}


def pump(
    call: Call, stream: str, send: Callable[[dict[str, Any], bytes], None], selector: Selector
) -> bool:
    """Send what one of ``call``'s output pipes holds to the host; at its end, close it and
    return True (the call may then be answered)."""
    pipe, is_open, header = PIPES[stream]
    if not getattr(call, is_open):
        return False
    fd = getattr(call.spawned, pipe)
    for _ in range(16):
        try:
            chunk = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return False
        if not chunk:
            close(call, stream, selector)
            return True
        keep = call.take(chunk, stream)
        if keep:
            send(dict(header, id=call.id), keep)
    return False


def close(call: Call, stream: str, selector: Selector) -> None:
    """Stop reading one of ``call``'s output pipes (at its end, or past the drain's time)."""
    pipe, is_open, _ = PIPES[stream]
    if not getattr(call, is_open):
        return
    setattr(call, is_open, False)
    fd = getattr(call.spawned, pipe)
    with suppress(KeyError, ValueError):
        selector.unregister(fd)
    os.close(fd)
    setattr(call.spawned, pipe, -1)


def feed_stdin(call: Call, selector: Selector) -> None:
    """Write what the call's stdin pipe takes now; close it once all is written."""
    fd = call.spawned.stdin
    if fd < 0:
        return
    try:
        written = os.write(fd, call.stdin[:READ_SIZE])
        call.stdin = call.stdin[written:]
    except BlockingIOError:
        return
    except OSError:
        call.stdin = memoryview(b"")  # the command closed its stdin: the rest is not wanted
    if not call.stdin:
        close_stdin(call, selector)


def close_stdin(call: Call, selector: Selector) -> None:
    if call.spawned.stdin < 0:
        return
    with suppress(KeyError, ValueError):
        selector.unregister(call.spawned.stdin)
    os.close(call.spawned.stdin)
    call.spawned.stdin = -1
