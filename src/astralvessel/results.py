"""ToolResult, and every rule that turns what a call did into what the model sees.

This module is the one renderer: command and built-in outcomes, file-tool text,
web pages, values returned by host tools, service replies, timeouts, refusals
and a sandbox that died all become a ``ToolResult`` here, with the notes worded
and joined one way. The executor then stamps each result with the tool's name,
the duration and, for calls that ran in the sandbox, the backend and policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, AnyStr

import attrs
import cattrs

from ._ground._outcome import Outcome, decide
from ._ground._refusals import Refusals
from ._ground._urlrefusals import url_refusal_words
from ._ground._webfailures import failure_words
from ._ground._webwords import page_head, page_notes
from .sandbox._api import ExecResult, MemoryStop
from .sandbox._base import FileOutcome, OutboxFile, RunOutcome
from .sandbox._session import (
    NOT_WRITTEN,
    OUTBOX_BYTES_PER_TURN,
    OUTBOX_FILES_PER_TURN,
    PAST_TURN_BYTES,
    PAST_TURN_FILES,
)
from .sandbox.server._outbox import FILES_PER_CALL, NOT_PLAIN, NOT_UTF8, TOO_BIG, TOO_MANY

if TYPE_CHECKING:
    from .web._content import Fenced
    from .web._fetch import WebResult

__all__ = [
    "NO_MATCHES",
    "SKIPPED_WORDS",
    "OutboxFile",
    "Outcome",
    "ToolResult",
    "cap_text",
    "command_output",
    "grep_text",
    "memory_notes",
    "refusal_notes",
    "render_command",
    "render_file",
    "render_grep",
    "render_host_value",
    "render_output",
    "render_page",
    "render_refusal",
    "render_sandbox_died",
    "render_service_reply",
    "render_timeout",
    "render_tool_error",
    "render_unreachable",
    "render_web",
    "skipped_note",
    "timeout_note",
    "truncation_note",
    "unlisted_note",
    "with_memory_notes",
    "with_notes",
    "with_refusal_notes",
]


@attrs.frozen(kw_only=True)
class ToolResult:
    """The outcome of one tool call. ``text`` is exactly what the model should see."""

    text: str
    is_error: bool = False
    #: The command's exit status; None when nothing ran (a refusal) or for non-command tools.
    exit_code: int | None = None
    timed_out: bool = False
    #: Characters of output cut to keep within ``tool_output_chars``.
    dropped_chars: int = 0
    files: tuple[OutboxFile, ...] = ()
    duration: float = 0.0
    #: The tool called, as the model named it.
    tool: str = ""
    #: The sandbox backend that ran it; None when it ran in the host (web, service and
    #: Python tools) or nothing ran (a refusal).
    backend: str | None = None
    #: ``Policy.identity`` of the sandbox it ran in, for audit; None exactly when ``backend`` is.
    policy_id: str | None = None
    #: Backend notes for the host (never shown to the model), such as a fallback taken.
    metadata: Mapping[str, str] = attrs.field(factory=dict)
    #: Whose failure it was (``Outcome``); the renderers below set it from what they know,
    #: and a result built without one (a host tool's own) is ``failed`` or ``timed_out``
    #: when it says it failed, else ``ok``.
    outcome: Outcome = attrs.field(converter=Outcome)

    @outcome.default
    def _outcome_from_flags(self) -> Outcome:
        return decide(timed_out=self.timed_out, failed=self.is_error)

    @classmethod
    def error(cls, text: str, *, tool: str = "", outcome: Outcome = Outcome.REFUSED) -> ToolResult:
        """A refusal or failure the model should read and act on; nothing ran."""
        return cls(text=text, is_error=True, tool=tool, outcome=outcome)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict: the CLI's ``--json`` output."""
        return {
            "tool": self.tool,
            "text": self.text,
            "is_error": self.is_error,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "dropped_chars": self.dropped_chars,
            "files": [{"name": f.name, "size": f.size, "path": str(f.path)} for f in self.files],
            "duration": round(self.duration, 6),
            "backend": self.backend,
            "policy_id": self.policy_id,
            "metadata": dict(self.metadata),
            "outcome": self.outcome.value,
        }


# -- notes ----------------------------------------------------------------------------------


def format_seconds(seconds: float) -> str:
    """``30`` for 30.0, ``2.5`` for 2.5: how limits are named to the model."""
    return f"{seconds:g}"


def truncation_note(dropped_chars: int) -> str:
    """The note that ends a cut result."""
    return f"[output truncated: {dropped_chars} more characters were dropped]"


def timeout_note(timeout: float) -> str:
    """The note that ends the result of a call that ran out of time."""
    return f"[timed out after {format_seconds(timeout)} s]"


def _joined(text: str, notes: list[str]) -> str:
    # One line break separates the text from the notes, whether or not it ended with one.
    if not notes:
        return text
    if not text:
        return "\n".join(notes)
    return "\n".join([text.removesuffix("\n"), *notes])


def refusal_notes(refusals: Refusals) -> list[str]:
    """One note per destination the egress proxy refused during a call, and one for the rest.

    Bounded whatever the call tried: ``Refusals`` names at most ten destinations.
    """
    notes = []
    for refused in refusals.destinations:
        where = f"{refused.host}:{refused.port}" if refused.host else "a request it could not read"
        times = f" ({refused.count} connections)" if refused.count > 1 else ""
        notes.append(f"[network: the egress proxy refused {where}{times}: {refused.reason}]")
    if refusals.others:
        notes.append(
            f"[network: the egress proxy refused {refusals.others} more connections "
            "to other destinations]"
        )
    return notes


def with_refusal_notes(result: ToolResult, refusals: Refusals) -> ToolResult:
    """``result`` with the notes of the connections the proxy refused during its call."""
    notes = refusal_notes(refusals)
    if not notes:
        return result
    return attrs.evolve(result, text=_joined(result.text, notes))


def render_output(
    output: str,
    *,
    exit_code: int | None,
    timed_out: bool,
    dropped_chars: int,
    timeout: float,
    show_exit_code: bool = False,
) -> str:
    """Apply the result rules to a command's combined output (already cut to the cap).

    Non-empty output is shown as is; empty output becomes ``[exit code N]``; a cut
    output ends with a note naming how many characters were dropped; a call that
    timed out keeps what it printed and ends with ``[timed out after N s]``.
    ``show_exit_code`` (the ``bash`` built-in) always ends with ``[exit code N]``.
    """
    notes: list[str] = []
    if dropped_chars:
        notes.append(truncation_note(dropped_chars))
    if timed_out:
        notes.append(timeout_note(timeout))
    elif show_exit_code or not output:
        notes.append(f"[exit code {exit_code}]")
    return _joined(output, notes)


def cap_text(text: str, cap: int) -> tuple[str, int]:
    """Cut ``text`` to ``cap`` characters with the truncation note; return it and the drop."""
    dropped = max(0, len(text) - cap)
    if not dropped:
        return text, 0
    return _joined(text[:cap], [truncation_note(dropped)]), dropped


# -- what stopped a call, what did not come back --------------------------------------------

#: The characters of the OS's words kept in the unlisted note.
UNLISTED_MAX = 300


def _memory_note(stop: MemoryStop) -> str:
    if stop.by == "watch":
        return (
            f"[memory limit: the turn's calls held {stop.held >> 20} MiB, more than the "
            f"{stop.limit >> 20} MiB limit; this call's processes were stopped]\n"
        )
    return (
        f"[memory limit: the kernel stopped {stop.killed} of the turn's processes while this "
        f"call ran; the turn held its whole {stop.limit >> 20} MiB (the calls' memory, the "
        "workspace's files and kernel buffers such as pipes); this call's processes "
        "were stopped]\n"
    )


def memory_notes(stops: Sequence[MemoryStop]) -> str:
    """The notes, one line each, for what stopped a call for memory; ``""`` when nothing did.

    The wording is the one ``docs/sandbox-server.md`` gives.
    """
    return "".join(_memory_note(stop) for stop in stops)


#: What the model reads for each reason an outbox entry was left out (``RunOutcome.skipped``).
SKIPPED_WORDS: Mapping[str, str] = MappingProxyType(
    {
        NOT_PLAIN: "not a plain file of the call's own (a folder, a link or a special file)",
        NOT_UTF8: "a name that is not UTF-8",
        TOO_MANY: f"more than {FILES_PER_CALL} files",
        TOO_BIG: "past the disk limit in total",
        PAST_TURN_FILES: f"past the turn's {OUTBOX_FILES_PER_TURN} outbox files",
        PAST_TURN_BYTES: f"past the turn's {OUTBOX_BYTES_PER_TURN >> 20} MiB of outbox files",
    }
)


def _skipped_words(reason: str, unwritten: str) -> str:
    if reason == NOT_WRITTEN:
        return f"could not be written on the host ({unwritten})"
    return SKIPPED_WORDS.get(reason, reason)  # none of ours: a peer's, cut by the session


def skipped_note(skipped: Mapping[str, int], unwritten: str = "") -> str:
    """The line the model reads when outbox entries were left out, counted by reason
    (``unwritten``: why the host could not write one, the OS's words)."""
    counts = sorted((_skipped_words(why, unwritten), n) for why, n in skipped.items())
    reasons = "; ".join(f"{n} {words}" for words, n in counts)
    return f"[outbox: {sum(skipped.values())} entries not returned: {reasons}]\n"


def unlisted_note(why: str) -> str:
    """The line the model reads when its outbox folder could not be listed: no file came back,
    and ``why`` (the path and the OS's words) says so, not an outbox that looks empty."""
    return f"[outbox: cannot be listed, no file returned: {why[:UNLISTED_MAX]}]\n"


def with_notes(text: AnyStr, notes: AnyStr) -> AnyStr:
    """``text`` (an output, or an exec's stderr) followed by ``notes`` on lines of their own."""
    newline = notes[-1:]  # every note ends its line: "\n" of the same type as ``text``
    if not notes or not text or text.endswith(newline):
        return text + notes
    return text + newline + notes


def command_output(outcome: RunOutcome) -> str:
    """What a confined call printed, then what the model is told of its outbox and of what
    stopped it for memory: the text every rule for a call's result starts from."""
    output = outcome.output
    if outcome.unlisted:
        output = with_notes(output, unlisted_note(outcome.unlisted))
    if outcome.skipped:
        # The model is told, in its own result, what it left that did not come back.
        output = with_notes(output, skipped_note(outcome.skipped, outcome.unwritten))
    return with_notes(output, memory_notes(outcome.memory))


def with_memory_notes(result: ExecResult) -> ExecResult:
    """A host's command's result (``Turn.exec``, a detached process's end) with the notes on
    what stopped it for memory ending its stderr, for the host."""
    notes = memory_notes(result.memory)
    if not notes:
        return result
    return attrs.evolve(result, stderr=with_notes(result.stderr, notes.encode()))


# -- calls that ran in the sandbox ----------------------------------------------------------


def render_command(
    outcome: RunOutcome, *, timeout: float, show_exit_code: bool = False
) -> ToolResult:
    """A confined call's outcome (a declared command, or ``bash`` with ``show_exit_code``)."""
    return ToolResult(
        text=render_output(
            command_output(outcome),
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            dropped_chars=outcome.dropped_chars,
            timeout=timeout,
            show_exit_code=show_exit_code,
        ),
        is_error=outcome.timed_out or outcome.exit_code != 0,
        exit_code=outcome.exit_code,
        timed_out=outcome.timed_out,
        dropped_chars=outcome.dropped_chars,
        files=outcome.files,
        duration=outcome.duration,
        metadata=dict(outcome.metadata),
        outcome=decide(
            timed_out=outcome.timed_out,
            limit=outcome.stopped_by_limit or outcome.dropped_chars > 0,
            failed=outcome.exit_code != 0,
        ),
    )


#: What ``grep`` answers when nothing matches (not an error).
NO_MATCHES = "No matches found."
#: The columns each ``grep`` result line keeps.
GREP_LINE_COLUMNS = 400


def grep_text(output: str, exit_code: int | None) -> tuple[str, bool]:
    """The text the model sees for a finished ``grep`` call, and whether it is an error.

    Exit 0 is matches (each line cut at 400 columns), 1 is no match (not an error),
    anything else an error whose text says why.
    """
    if exit_code == 0:
        lines = []
        for line in output.splitlines():
            # ripgrep and find print "./" before paths found from the workdir; drop it.
            shown = line[2:] if line.startswith("./") else line
            lines.append(shown[:GREP_LINE_COLUMNS])
        return "\n".join(lines), False
    if exit_code == 1 and not output.strip():
        return NO_MATCHES, False
    text = output.strip() or f"grep failed with exit code {exit_code}."
    return text, True


def render_grep(outcome: RunOutcome, *, timeout: float) -> ToolResult:
    """A ``grep`` call's outcome: its matches, "No matches found." or why it failed."""
    if outcome.timed_out:
        return render_command(outcome, timeout=timeout)
    text, is_error = grep_text(command_output(outcome), outcome.exit_code)
    notes = [truncation_note(outcome.dropped_chars)] if outcome.dropped_chars else []
    return ToolResult(
        text=_joined(text, notes),
        is_error=is_error,
        exit_code=outcome.exit_code,
        dropped_chars=outcome.dropped_chars,
        duration=outcome.duration,
        outcome=decide(
            limit=outcome.stopped_by_limit or outcome.dropped_chars > 0, failed=is_error
        ),
    )


def render_file(outcome: FileOutcome, *, cap: int) -> ToolResult:
    """What ``read``, ``glob`` or ``list`` answered, cut to the cap."""
    text, dropped = cap_text(outcome.text, cap)
    return ToolResult(
        text=text,
        is_error=outcome.is_error,
        dropped_chars=dropped,
        outcome=decide(limit=dropped > 0, failed=outcome.is_error),
    )


def render_sandbox_died(reason: str) -> ToolResult:
    """The one result a call gets when the turn's sandbox died under it."""
    return ToolResult.error(
        f"Error: the sandbox died while running this call ({reason}). Everything the turn "
        "had written in its workspace ($HOME, $TMPDIR) is lost. This was not caused by your "
        "arguments as such; the next call starts in a fresh, empty sandbox, so redo any "
        "setup the workspace needs before relying on it.",
        outcome=decide(lost=True),
    )


# -- web pages ------------------------------------------------------------------------------

# Inside the fence, anything that could close or reopen it, and any line that looks
# like one of our own notes, is defused: the model must be able to trust that the
# closing tag and the notes after it are ours, however the page text was cut.
_FENCE_TAG = re.compile(r"<(/?\s*web_content)", re.IGNORECASE)
_OUR_NOTE = re.compile(
    r"^(\s*)\[(?=\s*(output truncated|timed out after|exit code|webfetch |http \d))",
    re.IGNORECASE | re.MULTILINE,
)


def _defuse(page: str) -> str:
    return _OUR_NOTE.sub(r"\1&#91;", _FENCE_TAG.sub(r"&lt;\1", page))


def render_web(
    text: str | Fenced,
    *,
    is_error: bool,
    cap: int,
    metadata: Mapping[str, str],
    refused: bool = False,
) -> ToolResult:
    """A webfetch or websearch result, cut to the cap without ever losing its fence.

    ``text`` is the fetcher's or searcher's ``Fenced`` fields when it holds untrusted
    text, else its words (an error, with no page in it), cut as any text.
    ``refused``: nothing was sent (the arguments or the egress policy refused the call).

    The page text is cut, never the fence: the closing ``</web_content>`` tag, our
    truncation note and any note the fetcher added always follow the page text, so
    they may pass the cap by their own length. Inside the fence, a literal
    ``</web_content`` and lines that look like our notes are defused.
    """
    if isinstance(text, str):
        shown, dropped = cap_text(text, cap)
        return ToolResult(
            text=shown,
            is_error=is_error,
            dropped_chars=dropped,
            metadata=dict(metadata),
            outcome=decide(refused=refused, limit=dropped > 0, failed=is_error),
        )
    page = _defuse(text.inside)
    room = max(0, cap - len(text.framed("")))
    dropped = max(0, len(page) - room)
    if dropped:
        # Our note goes after the closing tag: outside the fence, where only we write.
        shown = text.framed(page[:room].removesuffix("\n"), first_notes=(truncation_note(dropped),))
    else:
        shown = text.framed(page)
    return ToolResult(
        text=shown,
        is_error=is_error,
        dropped_chars=dropped,
        metadata=dict(metadata),
        outcome=decide(limit=dropped > 0, failed=is_error),
    )


def render_page(result: WebResult, *, cap: int) -> ToolResult:
    """A webfetch or websearch result as the model reads it, worded from ``result``'s fields.

    The page (``fenced``: the source and what the fence holds) is framed with our
    lines, written here from the facts the fetcher returned: the HTTP error line
    from ``status`` and ``reason``, the note that reading stopped from
    ``stopped_at``. A result with no page (an error, a refusal) is its words.
    The metadata names the final URL and the status.
    """
    metadata = {
        key: str(value)
        for key, value in (("url", result.url), ("status", result.status))
        if value is not None
    }
    if result.fenced is None:
        words = _error_words(result)
        return render_web(
            words,
            is_error=result.is_error,
            cap=cap,
            metadata=metadata,
            refused=result.refused,
        )
    fenced = attrs.evolve(
        result.fenced,
        head=page_head(result.status, result.reason, is_error=result.is_error),
        notes=page_notes(result.stopped_at),
    )
    return render_web(fenced, is_error=result.is_error, cap=cap, metadata=metadata)


def _error_words(result: WebResult) -> str:
    """A result with no page, worded from its code: a refused URL, a failed fetch or search.

    A result with neither (an ``EgressError`` a host's policy raised with a message
    alone) is its text.
    """
    if result.egress is not None:
        return url_refusal_words(result.egress)
    if result.failed is not None:
        return failure_words(result.failed)
    return result.text


# -- host tools -----------------------------------------------------------------------------

#: What a host tool that returned nothing (None or "") shows the model.
NO_OUTPUT = "[no output]"
#: What a 2xx service reply with an empty body shows the model.
EMPTY_RESPONSE = "[empty response]"

# Host values are turned into JSON-ready data by cattrs' default unstructuring (attrs
# classes, dataclasses, enums, containers); this converter never structures anything.
_values = cattrs.Converter()


def render_host_value(value: object, *, tool: str, cap: int) -> ToolResult:
    """What a Python tool or bound callable returned: text as is, anything else as JSON.

    Raises ``TypeError`` (the host's mistake) for a value that cannot be shown.
    """
    if isinstance(value, ToolResult):
        return value
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", "replace")
    else:
        try:
            text = json.dumps(_values.unstructure(value), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"tool {tool!r} returned a {type(value).__name__}, which cannot be shown "
                f"to the model ({exc}); return str, a JSON-ready value, or an attrs instance"
            ) from None
    shown, dropped = cap_text(text or NO_OUTPUT, cap)
    return ToolResult(text=shown, dropped_chars=dropped, outcome=decide(limit=dropped > 0))


def render_tool_error(message: str, *, cap: int, raised: bool = True) -> ToolResult:
    """A ``ToolError`` a host tool raised: its message is the error text (``host_error``);
    ``raised=False`` for a failure the tool's service answered (``failed``)."""
    shown, dropped = cap_text(message, cap)
    return ToolResult(
        text=shown,
        is_error=True,
        dropped_chars=dropped,
        outcome=decide(host_error=raised, failed=True),
    )


def render_timeout(output: str, *, timeout: float, dropped_chars: int = 0) -> ToolResult:
    """A host call past its timeout: what arrived so far, then ``[timed out after N s]``."""
    return ToolResult(
        text=render_output(
            output, exit_code=None, timed_out=True, dropped_chars=dropped_chars, timeout=timeout
        ),
        is_error=True,
        timed_out=True,
        dropped_chars=dropped_chars,
        outcome=decide(timed_out=True),
    )


def render_service_reply(
    service: str, *, status: int, reason: str, text: str, dropped_chars: int, cap: int
) -> ToolResult:
    """A service's HTTP answer: a 2xx body is the result; any other status is an error.

    ``text`` is the body decoded, already cut to the cap (a 2xx reply) or to a
    short quote (any other), with ``dropped_chars`` more that were not kept.
    """
    metadata = {"http_status": str(status)}
    if 200 <= status < 300:
        if not text and not dropped_chars:
            return ToolResult(text=EMPTY_RESPONSE, metadata=metadata, outcome=decide())
        notes = [truncation_note(dropped_chars)] if dropped_chars else []
        return ToolResult(
            text=_joined(text, notes),
            dropped_chars=dropped_chars,
            metadata=metadata,
            outcome=decide(limit=dropped_chars > 0),
        )
    quoted = " ".join(text.split()) + (" ..." if dropped_chars else "")
    redirect = " (redirects are not followed)" if 300 <= status < 400 else ""
    message = (
        f"Error: the {service} service answered HTTP {status} {reason}".rstrip()
        + redirect
        + (f": {quoted.strip()}" if quoted.strip() else "")
    )
    return attrs.evolve(render_tool_error(message, cap=cap, raised=False), metadata=metadata)


def render_unreachable(service: str, exc: BaseException) -> ToolResult:
    """A service that could not be reached at all."""
    detail = str(exc) or type(exc).__name__
    return ToolResult.error(
        f"Error: the {service} service could not be reached ({detail}). "
        "This is not a problem with your arguments; you may try again later.",
        outcome=decide(lost=True),
    )


def render_refusal(message: str) -> ToolResult:
    """A call refused before anything ran (unknown tool, bad arguments)."""
    return ToolResult.error(message, outcome=decide(refused=True))
