"""The engine's answer to a container's start, awaited while the host meets the container.

A turn's start is mostly the engine's own start request (runc, cgroups, mounts),
and the container's process runs before the engine answers it. ``Starting``
asks it on a thread of its own, so the host can accept the server's connection
and send it its code meanwhile (``Engine.start_meeting``, ``Listener.accept``);
``start_failure`` words a failed step for the host.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ...errors import BackendUnavailableError
from ._gate import status_of

__all__ = ["EngineRefused", "Starting", "start_failure"]


class EngineRefused(Exception):
    """The engine's refusal of a start, carried out of ``meet`` (``Starting.result``)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Starting:
    """The engine's answer to a container's start, asked on a thread of its own.

    So the host meets the container's process while the engine still works on
    the start (``Engine.start_meeting``). ``fileno`` turns readable once the
    answer is in; ``result`` waits for it and raises a refusal.
    """

    def __init__(self, api: Any, container_id: str) -> None:
        self._engine = str(api.base_url)
        self._read, self._write = os.pipe()
        self._error: Exception | None = None
        self._done = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._start, args=(api, container_id), name="docker-start", daemon=True
        )
        self._thread.start()

    def _start(self, api: Any, container_id: str) -> None:
        try:
            api.start(container_id)
        except Exception as exc:
            self._error = exc
        finally:
            os.write(self._write, b"!")

    def fileno(self) -> int:
        """Readable once the engine has answered."""
        return self._read

    def result(self) -> None:
        """Wait for the engine's answer; raise its refusal (as ``EngineRefused``). Repeatable."""
        self._thread.join()
        with self._lock:
            if not self._done:
                self._done = True
                os.close(self._read)
                os.close(self._write)
        if self._error is not None:
            raise EngineRefused(self._error)

    def settle(self) -> None:
        """``result``, a refusal raised as ``BackendUnavailableError`` naming the start."""
        try:
            self.result()
        except EngineRefused as refused:
            raise BackendUnavailableError(
                start_failure("start", refused.cause, self._engine)
            ) from None


def start_failure(step: str, exc: BaseException, engine: str) -> str:
    """What to tell the host when ``step`` of a container start failed with ``exc``."""
    if status_of(exc) is None:
        return (
            f"docker cannot start the turn's container: the engine at {engine} did not answer "
            f"the request to {step} it ({exc}). If `docker info` hangs too, the engine is "
            "stuck: see docs/troubleshooting.md, 'The Docker engine stopped answering'"
        )
    explanation = getattr(exc, "explanation", None) or exc
    return (
        f"docker cannot start the turn's container: the engine at {engine} refused to "
        f"{step} it: {explanation}"
    )
