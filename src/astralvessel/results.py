"""ToolResult, and the exact rules that turn a command's outcome into what the model sees."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .sandbox._base import OutboxFile

__all__ = ["OutboxFile", "ToolResult", "render_output"]


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
    #: The sandbox backend that ran it, if any.
    backend: str | None = None
    #: ``Policy.identity`` of the sandbox it ran in, for audit.
    policy_id: str | None = None
    #: Backend notes for the host (never shown to the model), such as a fallback taken.
    metadata: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def error(cls, text: str, *, tool: str = "") -> ToolResult:
        """A refusal or failure the model should read and act on; nothing ran."""
        return cls(text=text, is_error=True, tool=tool)

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
        }


def format_seconds(seconds: float) -> str:
    """``30`` for 30.0, ``2.5`` for 2.5: how limits are named to the model."""
    return f"{seconds:g}"


def truncation_note(dropped_chars: int) -> str:
    """The note that ends a cut result."""
    return f"[output truncated: {dropped_chars} more characters were dropped]"


def timeout_note(timeout: float) -> str:
    """The note that ends the result of a call that ran out of time."""
    return f"[timed out after {format_seconds(timeout)} s]"


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
    if not notes:
        return output
    if not output:
        return "\n".join(notes)
    # One line break separates the output from the notes, whether or not it ended with one.
    return "\n".join([output.removesuffix("\n"), *notes])
