"""What a turn tells the host about itself: log events, ledger records and trace spans.

``Turn`` holds one ``TurnWatch`` and tells it each event (opened, a call, an
exec, a file operation, a sandbox started or lost, closed); the watch fans
each out to the loggers (``_log``), the turn's ledger (``_ledger``) and
OpenTelemetry (``_otel``, when the extra is installed). Nothing here changes
what a call returns.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from .._ground import _log, _otel
from .._ground._ledger import Ledger, LedgerSink, bounded
from .._ground._ledger._records import SCHEMA_VERSION, digest
from .._ground._outcome import Outcome
from ..results import ToolResult, command_output
from ..sandbox._api import ExecResult, FileOutcome, RunOutcome

if TYPE_CHECKING:
    from ..web._proxy import EgressProxy

__all__ = ["CallNote", "ExecNote", "FileNote", "TurnWatch", "byte_size"]


@attrs.define
class CallNote:
    """What one call's ``with`` block learns: the sandbox's own outcome, and the result."""

    result: ToolResult | None = None
    ran: object = None


@attrs.define
class ExecNote:
    """What one exec's ``with`` block learns."""

    result: ExecResult | None = None


@attrs.define
class FileNote:
    """What one file operation's ``with`` block learns: how many bytes it moved."""

    size: int | None = None


def byte_size(data: object) -> int | None:
    """How many bytes ``write_file`` is given (text as UTF-8); None for a wrong type, which
    its checks then refuse."""
    if isinstance(data, str):
        try:
            return len(data.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: write_file's checks refuse it
            return None
    return len(data) if isinstance(data, (bytes, bytearray, memoryview)) else None


def _ran(outcome: object, limit: int) -> dict[str, Any] | None:
    """The sandbox's own answer to a call, as replay needs it; None for host-side calls.

    A Ray node sends its answer already recorded (a dict, cut at this ledger's limit).
    """
    if isinstance(outcome, Mapping):
        return dict(outcome)
    if isinstance(outcome, RunOutcome):
        return {
            # The output with its notes, as the model read it: replay words nothing again.
            "output": bounded(command_output(outcome), limit),
            "exit_code": outcome.exit_code,
            "timed_out": outcome.timed_out,
            "dropped_chars": outcome.dropped_chars,
            "stopped_by_limit": outcome.stopped_by_limit,
        }
    if isinstance(outcome, FileOutcome):
        return {"text": bounded(outcome.text, limit), "is_error": outcome.is_error}
    return None


def _file_entry(path: Path, name: str, size: int) -> dict[str, Any]:
    """An outbox file by its name, size and hash (its bytes stay in the outbox)."""
    entry: dict[str, Any] = {"name": name, "size": size}
    with contextlib.suppress(OSError):
        entry["sha256"] = digest(path.read_bytes())
    return entry


def _span_attributes(fields: Mapping[str, object], *, leave: Iterable[str]) -> dict[str, object]:
    """A log event's fields as span attributes (``astralvessel.`` names), but those left out."""
    return {f"astralvessel.{k}": v for k, v in fields.items() if k not in leave}


class TurnWatch:
    """One turn's observer: its id, its ledger sink, its span, and the events it has seen."""

    def __init__(self, *, backend: str, policy_id: str | None, ledger: Ledger | None) -> None:
        self.turn_id = uuid.uuid4().hex[:16]
        self.backend = backend
        self.policy_id = policy_id
        self._ledger = ledger
        self._sink: LedgerSink | None = None
        self._opened = time.monotonic()
        # next() on a count is atomic: calls of one turn may end in several threads at once.
        self._seq = itertools.count(1)
        self._calls = 0
        self._span = _otel.start("astralvessel.turn", self._turn_attributes())
        self._closed = False
        _log.event(_log.TURN, "turn.opened", self._turn_fields())
        if ledger is not None:
            self._sink = ledger.open(self.turn_id)
            # A turn dropped without close still syncs and closes its file when collected.
            weakref.finalize(self, self._sink.close).atexit = False
            self._record(
                {
                    "event": "turn",
                    "schema": SCHEMA_VERSION,
                    "turn": self.turn_id,
                    "policy_id": policy_id,
                    "backend": backend,
                    "identity": os.geteuid(),
                    "time": time.time(),
                }
            )

    def _turn_fields(self) -> dict[str, object]:
        return {
            "turn": self.turn_id,
            "backend": self.backend,
            "policy_id": self.policy_id,
            "uid": os.geteuid(),
        }

    def _turn_attributes(self) -> dict[str, Any]:
        return _span_attributes(self._turn_fields(), leave=("uid",))

    def _record(self, record: dict[str, Any]) -> None:
        sink = self._sink
        if sink is not None:
            sink.write(record)

    def _limit(self) -> int:
        return self._ledger.max_chars if self._ledger is not None else 8192

    # -- events -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def call(self, name: object, arguments: object) -> Iterator[CallNote]:
        """Watch one tool call; the block sets ``note.result`` (and ``note.ran``)."""
        note = CallNote()
        started = time.monotonic()
        span = _otel.start("astralvessel.call", {"astralvessel.tool": str(name)}, parent=self._span)
        try:
            yield note
        finally:
            _otel.end(span, self._call_attributes(note.result))
            if note.result is not None:
                self._called(
                    str(name), arguments, note.result, note.ran, time.monotonic() - started
                )

    @staticmethod
    def _call_attributes(result: ToolResult | None) -> dict[str, Any]:
        if result is None:
            return {}
        return {
            "astralvessel.outcome": result.outcome.value,
            "astralvessel.backend": result.backend or "host",
            "astralvessel.text_chars": len(result.text),
            "astralvessel.dropped_chars": result.dropped_chars,
        }

    def _called(
        self, name: str, arguments: object, result: ToolResult, ran: object, duration: float
    ) -> None:
        seq = self._calls = next(self._seq)
        fields: dict[str, object] = {
            "turn": self.turn_id,
            "tool": name,
            "outcome": result.outcome.value,
            "duration": duration,
            "text_chars": len(result.text),
            "dropped_chars": result.dropped_chars,
            "files": len(result.files),
        }
        _log.event(_log.CALLS, "call", fields)
        if result.outcome is Outcome.REFUSED:
            _log.event(_log.REFUSALS, "call.refused", {"turn": self.turn_id, "tool": name})
        if self._sink is None:
            return
        limit = self._limit()
        record: dict[str, Any] = {
            "event": "call",
            "turn": self.turn_id,
            "seq": seq,
            "tool": name,
            "arguments": bounded(arguments, limit),
            "text": bounded(result.text, limit),
            "outcome": result.outcome.value,
            "is_error": result.is_error,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "dropped_chars": result.dropped_chars,
            "backend": result.backend,
            "policy_id": result.policy_id,
            "duration": round(duration, 6),
            "files": [_file_entry(f.path, f.name, f.size) for f in result.files],
        }
        raw = _ran(ran, limit)
        if raw is not None:
            record["ran"] = raw
        self._record(record)

    @contextlib.contextmanager
    def _operation(
        self,
        event: str,
        subject: tuple[str, object],
        ended: Callable[[BaseException | None, float], dict[str, object]],
    ) -> Iterator[None]:
        """Watch one of the host's operations on the sandbox (an exec, a file operation).

        Its span and log event are named ``event`` and carry ``subject``; ``ended`` gets
        the error the block raised (or None) and the duration, writes the ledger record,
        and returns the fields the log event and the span end with.
        """
        started = time.monotonic()
        key, value = subject
        span = _otel.start(f"astralvessel.{event}", {f"astralvessel.{key}": value}, self._span)
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            duration = time.monotonic() - started
            fields = {"turn": self.turn_id, key: value, **ended(error, duration)}
            fields["duration"] = duration
            _log.event(_log.EXEC, event, fields)
            _otel.end(span, _span_attributes(fields, leave=("turn",)))

    @contextlib.contextmanager
    def exec(self, argv: Sequence[object]) -> Iterator[ExecNote]:
        """Watch one ``Turn.exec``; the block sets ``note.result``."""
        note = ExecNote()
        program = os.path.basename(str(argv[0])) if argv else ""

        def ended(error: BaseException | None, duration: float) -> dict[str, object]:
            result = note.result
            self._exec_record(argv, result, error, duration)
            if result is None:
                return {"error": type(error).__name__ if error is not None else "none"}
            return {
                "outcome": result.outcome.value,
                "returncode": result.returncode,
                "stdout_bytes": len(result.stdout),
                "stderr_bytes": len(result.stderr),
            }

        with self._operation("exec", ("program", program), ended):
            yield note

    def _exec_record(
        self,
        argv: Sequence[object],
        result: ExecResult | None,
        error: BaseException | None,
        duration: float,
    ) -> None:
        if self._sink is None:
            return
        limit = self._limit()
        record: dict[str, Any] = {
            "event": "exec",
            "turn": self.turn_id,
            "argv": bounded([str(a) for a in argv], limit),
            "duration": round(duration, 6),
        }
        if result is not None:
            record.update(
                returncode=result.returncode,
                outcome=result.outcome.value,
                timed_out=result.timed_out,
                truncated=result.truncated,
                stdout=bounded(result.stdout.decode("utf-8", "replace"), limit),
                stderr=bounded(result.stderr.decode("utf-8", "replace"), limit),
            )
        elif error is not None:
            record["error"] = f"{type(error).__name__}: {error}"[:limit]
        self._record(record)

    @contextlib.contextmanager
    def file(self, op: str, path: object) -> Iterator[FileNote]:
        """Watch one file operation (``read``, ``write``, ``list``); the block sets the size."""
        note = FileNote()

        def ended(error: BaseException | None, duration: float) -> dict[str, object]:
            if self._sink is not None:
                self._record(
                    {
                        "event": "file",
                        "turn": self.turn_id,
                        "op": op,
                        "path": bounded(str(path), self._limit()),
                        "size": note.size,
                        "error": None if error is None else f"{type(error).__name__}: {error}",
                        "duration": round(duration, 6),
                    }
                )
            fields: dict[str, object] = {"size": note.size}
            if error is not None:
                fields["error"] = type(error).__name__
            return fields

        with self._operation("file", ("op", op), ended):
            yield note

    def sandbox_started(self, duration: float, proxy: EgressProxy | None = None) -> None:
        """The turn's sandbox started (or was taken from the warm pool), in ``duration`` s;
        its egress proxy's connection spans become the turn span's children."""
        if proxy is not None:
            proxy.trace_parent = self._span
        fields = {"turn": self.turn_id, "backend": self.backend, "duration": duration}
        _log.event(_log.SANDBOX, "sandbox.started", fields)
        _otel.record(
            "astralvessel.sandbox.start",
            {"astralvessel.backend": self.backend},
            self._span,
            duration,
        )
        self._record({"event": "sandbox", "what": "started", **fields})

    def sandbox_lost(self, reason: str) -> None:
        """The turn's sandbox died; the next use starts a fresh one."""
        fields = {"turn": self.turn_id, "backend": self.backend, "reason": reason[:500]}
        _log.event(_log.SANDBOX, "sandbox.lost", fields, _log.WARNING)
        self._record({"event": "sandbox", "what": "lost", **fields})

    def closed(self) -> None:
        """The turn ended: log it, end its span, write the last record and sync the file."""
        if self._closed:
            return
        self._closed = True
        duration = time.monotonic() - self._opened
        _log.event(
            _log.TURN,
            "turn.closed",
            {**self._turn_fields(), "calls": self._calls, "duration": duration},
        )
        _otel.end(self._span, {"astralvessel.calls": self._calls})
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.write(
                {
                    "event": "close",
                    "turn": self.turn_id,
                    "calls": self._calls,
                    "duration": round(duration, 6),
                }
            )
            sink.close()
