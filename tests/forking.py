"""Run a step in a child forked from the test process, as a host that forks while turns are open."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

__all__ = ["in_forked_child"]


def in_forked_child(step: Callable[[], str]) -> str:
    """What ``step`` returned in a child forked now (or the error it raised), by a pipe."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a threaded process may deadlock the child: the case.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's exit handlers
        os.close(read_end)
        try:
            met = step()
        except BaseException as error:
            met = f"{type(error).__name__}: {error}"
        os.write(write_end, met.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        met = reader.read().decode()
    os.waitpid(pid, 0)
    return met
