"""Replaying a turn ledger: each call a test makes answered with what the real sandbox said.

A ledger's call records that ran in the sandbox carry the sandbox's own answer
(``ran``: a command's output and exit, a file tool's text). ``Replay`` hands
them back to ``FakeSandbox``: the first unused record of the same tool with
the same arguments (those the model gave; the sandbox also sees a built-in's
defaults); among equal ones, in the order recorded. A call with no
such record fails the test with ``UnscriptedCallError`` naming how it differs
from the next unused record.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._ground._ledger._records import CUT, read_ledger
from ..errors import UnscriptedCallError
from ..sandbox._api import FileOutcome, RunOutcome

__all__ = ["Replay"]


def _arguments(value: object) -> object:
    """Recorded arguments as the call gave them: the model's JSON text is parsed."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _difference(tool: str, arguments: Mapping[str, Any], record: Mapping[str, Any]) -> str:
    """How a call differs from a record: the tool, or the first argument that is not the same."""
    if record["tool"] != tool:
        return f"this call is {tool}, the ledger's next is {record['tool']}"
    recorded = _arguments(record["arguments"])
    if not isinstance(recorded, Mapping):
        return f"the ledger's arguments were {json.dumps(recorded)[:200]}"
    for name in sorted(recorded):
        here, there = arguments.get(name, "(absent)"), recorded[name]
        if here != there:
            return f"argument {name!r} differs: {here!r:.200} here, {there!r:.200} in the ledger"
    return "the same arguments, but that record was answered already"


def _matches(record: Mapping[str, Any], tool: str, arguments: Mapping[str, Any]) -> bool:
    """Whether ``record`` is this call: the same tool, and every argument the model gave the
    same. The sandbox sees a built-in's defaults too (grep's ``max_results``), which the
    model's recorded arguments leave out, so an argument only the call has is a default."""
    recorded = _arguments(record["arguments"])
    return (
        record["tool"] == tool
        and isinstance(recorded, Mapping)
        and all(name in arguments and arguments[name] == v for name, v in recorded.items())
    )


class Replay:
    """The recorded sandbox answers of a ledger, handed out once each."""

    def __init__(self, records: Iterable[Mapping[str, Any]], source: str) -> None:
        self.source = source
        self._records = [r for r in records if r.get("event") == "call" and "ran" in r]
        self._used: set[int] = set()
        self._lock = threading.Lock()

    @classmethod
    def read(cls, path: str | Path) -> Replay:
        """The replay of the ledger file at ``path``."""
        return cls(read_ledger(path), str(path))

    def _take(self, tool: str, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        with self._lock:
            unused = [i for i in range(len(self._records)) if i not in self._used]
            for index in unused:
                record = self._records[index]
                if _matches(record, tool, arguments):
                    self._used.add(index)
                    return record["ran"]  # type: ignore[no-any-return]
        shown = json.dumps(dict(arguments), ensure_ascii=False, default=str)[:200]
        raise UnscriptedCallError(
            f"the ledger {self.source} has no call {tool} {shown}: "
            + self._why(tool, arguments, unused)
        )

    def _why(self, tool: str, arguments: Mapping[str, Any], unused: list[int]) -> str:
        """Why no record answers the call: its equals were used, or how it differs from the
        next unused record of its tool (else the next unused record)."""
        equal = sum(_matches(self._records[i], tool, arguments) for i in self._used)
        if equal:
            return f"the ledger's {equal} equal call(s) were answered already"
        same_tool = [i for i in unused if self._records[i]["tool"] == tool]
        nearest = (same_tool or unused)[:1]
        if not nearest:
            return "every recorded call was answered already"
        return _difference(tool, arguments, self._records[nearest[0]])

    def run(self, tool: str, arguments: Mapping[str, Any]) -> RunOutcome:
        """A confined call's recorded outcome."""
        ran = self._take(tool, arguments)
        return RunOutcome(
            output=_whole(ran["output"], tool),
            exit_code=ran.get("exit_code"),
            timed_out=bool(ran.get("timed_out")),
            dropped_chars=int(ran.get("dropped_chars") or 0),
            stopped_by_limit=bool(ran.get("stopped_by_limit")),
        )

    def view(self, tool: str, arguments: Mapping[str, Any]) -> FileOutcome:
        """A file tool's recorded text."""
        ran = self._take(tool, arguments)
        return FileOutcome(text=_whole(ran["text"], tool), is_error=bool(ran.get("is_error")))


def _whole(value: object, tool: str) -> str:
    if isinstance(value, Mapping) and CUT in value:
        raise UnscriptedCallError(
            f"the ledger cut the {tool} call's output at {len(value[CUT])} of {value['chars']} "
            "characters; record it with a larger Ledger(max_chars=) to replay it"
        )
    return str(value)
