"""Outbox files as the model APIs take them: what to attach, in a budget, notes for the rest.

``attachments`` decides (by a table of media types, the API's accepted kinds and
a ``MediaBudget``) and reads the chosen files; every file it does not attach
gets one note in the result's text saying why, so the model always learns a
file was made. The adapters then shape the attachments as their API's blocks.
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import attrs
from attrs import validators

from ..results import OutboxFile

__all__ = ["Attachment", "MediaBudget", "attachments", "data_url", "with_notes"]

_MIB = 1 << 20

#: What each attachable media type is, for the APIs' block kinds.
KINDS: Mapping[str, str] = MappingProxyType(
    {
        "image/png": "image",
        "image/jpeg": "image",
        "image/gif": "image",
        "image/webp": "image",
        "application/pdf": "pdf",
        "text/plain": "text",
        "text/markdown": "text",
        "text/csv": "text",
    }
)


@attrs.frozen(kw_only=True)
class MediaBudget:
    """How much of a result's outbox files may go to the model as attachments.

    A file over ``max_file_bytes``, past ``max_files`` or past ``max_total_bytes``
    in all stays out, and the result's text names it instead. The defaults keep
    within the APIs' own limits (Anthropic takes images up to 5 MB).
    """

    max_file_bytes: int = attrs.field(default=5 * _MIB, validator=validators.gt(0))
    max_total_bytes: int = attrs.field(default=20 * _MIB, validator=validators.gt(0))
    max_files: int = attrs.field(default=8, validator=validators.ge(0))

    @classmethod
    def text_only(cls) -> MediaBudget:
        """Attach nothing: every file is named in the text."""
        return cls(max_files=0)


@attrs.frozen(kw_only=True)
class Attachment:
    """One outbox file to send to the model: its name, media type, kind and bytes."""

    name: str
    media_type: str
    kind: str
    data: bytes = attrs.field(repr=False)

    @property
    def base64(self) -> str:
        """The bytes in base64, as the APIs carry them."""
        return base64.b64encode(self.data).decode("ascii")


def data_url(attachment: Attachment) -> str:
    """The attachment as a ``data:`` URL."""
    return f"data:{attachment.media_type};base64,{attachment.base64}"


def _media_type(name: str) -> str:
    kind, _ = mimetypes.guess_type(name, strict=False)
    if kind is None and name.lower().endswith(".md"):
        return "text/markdown"
    return kind or "application/octet-stream"


def attachments(
    files: Sequence[OutboxFile], *, kinds: frozenset[str], budget: MediaBudget, api: str
) -> tuple[list[Attachment], list[str]]:
    """The files to attach (read from the host) and one note for each file left out.

    ``kinds`` are the attachment kinds the API takes in a tool result (empty: none).
    """
    chosen: list[Attachment] = []
    notes: list[str] = []
    total = 0
    for file in files:
        media_type = _media_type(file.name)
        kind = KINDS.get(media_type)
        if kind is None or kind not in kinds:
            why = f"{api} takes no {media_type} in a tool result"
        elif file.size > budget.max_file_bytes:
            why = f"larger than the {budget.max_file_bytes} bytes one attachment may be"
        elif budget.max_files == 0:
            why = "the host attaches no files"
        elif len(chosen) >= budget.max_files:
            why = f"past the {budget.max_files} files one result may attach"
        elif total + file.size > budget.max_total_bytes:
            why = f"past the {budget.max_total_bytes} bytes one result may attach"
        else:
            try:
                data = file.path.read_bytes()
            except OSError as exc:
                why = f"it could not be read on the host ({exc.strerror or exc})"
            else:
                if kind == "text" and not _utf8(data):
                    why = "it is not UTF-8 text"
                else:
                    chosen.append(
                        Attachment(name=file.name, media_type=media_type, kind=kind, data=data)
                    )
                    total += len(data)
                    continue
        notes.append(f"[outbox file {file.name} ({file.size} bytes) not attached: {why}]")
    return chosen, notes


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def with_notes(text: str, notes: Sequence[str]) -> str:
    """The result text with the notes for files left out on lines after it."""
    if not notes:
        return text
    return "\n".join([text.removesuffix("\n"), *notes]) if text else "\n".join(notes)
