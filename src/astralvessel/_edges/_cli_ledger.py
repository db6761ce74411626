"""The ``astralvessel ledger show FILE`` command: a turn ledger, one readable line per record."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from .._ground._ledger._records import CUT, read_ledger
from ._terminal import for_terminal

__all__ = ["describe", "register"]

#: How many characters of a text or argument set a line shows.
_SHOWN = 100


def register(subparsers: Any) -> None:
    """Add the ``ledger`` subcommand (``ledger show FILE``) to the CLI's subparsers."""
    parser = subparsers.add_parser("ledger", help="read turn ledgers")
    actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    show = actions.add_parser("show", help="print a ledger file, one line per record")
    show.add_argument("file")
    show.set_defaults(handler=_show)


def _short(value: object) -> str:
    if isinstance(value, Mapping) and CUT in value:
        text = f"{value[CUT]}… ({value['chars']} chars, sha256 {str(value['sha256'])[:12]})"
    else:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def _seconds(record: Mapping[str, Any]) -> str:
    return f"{float(record.get('duration') or 0):.3f}s"


def _turn(r: Mapping[str, Any]) -> str:
    return (
        f"turn {r['turn']}  backend={r.get('backend')} policy={r.get('policy_id')} "
        f"uid={r.get('identity')} schema={r.get('schema')}"
    )


def _call(r: Mapping[str, Any]) -> str:
    files = "".join(f"  +{f['name']} ({f['size']} B)" for f in r.get("files") or ())
    return (
        f"  #{r.get('seq')} {r['tool']} {_short(r.get('arguments'))} -> {r.get('outcome')} "
        f"{_seconds(r)}  {_short(r.get('text'))}{files}"
    )


def _exec(r: Mapping[str, Any]) -> str:
    result = f"{r.get('outcome')} rc={r.get('returncode')}" if "returncode" in r else r.get("error")
    return f"  exec {_short(r.get('argv'))} -> {result} {_seconds(r)}"


def _file(r: Mapping[str, Any]) -> str:
    result = r.get("error") or f"{r.get('size')} B"
    return f"  {r['op']} {_short(r.get('path'))} -> {result} {_seconds(r)}"


def _sandbox(r: Mapping[str, Any]) -> str:
    why = f": {r['reason']}" if r.get("reason") else ""
    return f"  sandbox {r.get('what')}{why}"


def _close(r: Mapping[str, Any]) -> str:
    return f"closed: {r.get('calls')} calls in {_seconds(r)}"


#: How each kind of record reads; an unknown kind is shown as its JSON.
_LINES = {
    "turn": _turn,
    "call": _call,
    "exec": _exec,
    "file": _file,
    "sandbox": _sandbox,
    "close": _close,
}


def describe(record: Mapping[str, Any]) -> str:
    """One record as one line (its control characters shown, not obeyed)."""
    line = _LINES.get(str(record.get("event")))
    return for_terminal(line(record) if line else json.dumps(record, ensure_ascii=False))


def _show(args: argparse.Namespace) -> int:
    for record in read_ledger(args.file):
        sys.stdout.write(describe(record) + "\n")
    return 0
