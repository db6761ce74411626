"""The ``docker-exec`` session: each call one ``docker exec`` in the turn's container, no server.

For images without a usable ``python3`` the sandbox server cannot run, so each
call is an exec as uid 65534 in a container that carries every limit and the
``calls`` seccomp profile. It is a second, smaller implementation of the
session API, with its own conformance run (``tests/conformance``) that declares
what it cannot keep: calls run one at a time, the file tools are unavailable,
and a call joins the container's PID namespace, where its idle first process is
visible. Everything a call controls stays bounded on the host as in server
mode: output in bytes (``OutputBuffer``), and outbox files by count and bytes,
regular files with one link only, never following a link.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ...errors import SandboxError
from .._api import FileOutcome, OutboxFile, RunOutcome, RunRequest, SandboxSession
from .._policy import Policy, Promise
from ._attach import TIMED_OUT, AttachChannel, close_attached, frames, raw_socket
from ._spec import CALL_UID, exec_argv

__all__ = [
    "EXEC_METADATA",
    "EXEC_NOTE",
    "EXEC_UNENFORCED",
    "OUTBOX_MAX_FILES",
    "ExecSession",
    "OutboxEntry",
    "OutputBuffer",
    "outbox_listing_argv",
    "parse_listing",
    "plan_outbox",
]

EXEC_NOTE = (
    "each call is one `docker exec` in the turn's container (no sandbox server): calls of one "
    "turn run one at a time and the file tools are unavailable"
)
#: Promises this mode cannot keep, each with why (what ``doctor`` and ``unenforced`` say).
EXEC_UNENFORCED: Mapping[Promise, str] = {
    Promise.PROCESS_ISOLATION: (
        "docker-exec: every call joins the container's PID namespace and can see its idle "
        "first process; use the docker backend with an image that has python3 3.8+"
    ),
}
#: What each call's result says about how it ran (for the host; the model never sees it).
EXEC_METADATA: Mapping[str, str] = {"docker_mode": "exec-per-call", "docker_note": EXEC_NOTE}
#: Outbox files one call may return; past that the rest are dropped and the metadata says so.
OUTBOX_MAX_FILES = 100
#: Bytes of one helper command's output the host reads at most (the outbox listing).
_HELPER_OUTPUT_MAX = (OUTBOX_MAX_FILES + 1) * (255 + 24)
#: One read of an exec stream; also the most the host holds of a call's output beyond its cap.
_CHUNK = 65536


class OutputBuffer:
    """A call's combined output: ``limit`` characters kept, the rest counted, host memory bounded.

    Characters are those of the text the model sees (UTF-8, an undecodable
    byte counting as the one replacement character it shows as), so output
    made only of continuation bytes is cut like any other. The host never
    holds more than ``limit`` characters plus one decoded read.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept: list[str] = []
        self.kept_chars = 0
        self.dropped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, payload: bytes, *, final: bool = False) -> None:
        """Count and keep (up to the limit) the characters ``payload`` completes."""
        text = self._decoder.decode(payload, final)
        room = max(self.limit - self.kept_chars, 0)
        if room:
            kept = text[:room]
            self._kept.append(kept)
            self.kept_chars += len(kept)
        self.dropped += max(len(text) - room, 0)

    @property
    def text(self) -> str:
        """What was kept."""
        return "".join(self._kept)


@attrs.frozen(kw_only=True)
class OutboxEntry:
    """One file the outbox listing named: its raw name and size."""

    name: bytes
    size: int


def outbox_listing_argv(outbox: str, max_files: int) -> list[str]:
    """A command listing the outbox's regular, single-link files as ``size/name\\0``.

    ``find`` without ``-L`` never follows a symbolic link (it is type ``l``,
    not ``f``), and ``-links 1`` leaves out hard links, which would let a call
    return one workspace file many times over. One entry past ``max_files`` is
    listed so the host can tell the outbox held more.
    """
    return [
        "/bin/sh",
        "-c",
        'find "$1" -mindepth 1 -maxdepth 1 -type f -links 1 -printf "%s/%f\\0" | head -z -n "$2"',
        "sh",
        outbox,
        str(max_files + 1),
    ]


def parse_listing(data: bytes) -> list[OutboxEntry]:
    """Parse ``size/name\\0`` entries; a malformed one (cut short) is left out."""
    entries = []
    for record in data.split(b"\0"):
        size, sep, name = record.partition(b"/")
        if sep and size.isdigit() and name and name not in {b".", b".."}:
            entries.append(OutboxEntry(name=name, size=int(size)))
    return entries


def plan_outbox(
    entries: Sequence[OutboxEntry], *, max_files: int, max_bytes: int
) -> tuple[list[tuple[str, int]], list[str]]:
    """Which files to copy out (name, size), in name order, and why the others were not."""
    take: list[tuple[str, int]] = []
    skipped: list[str] = []
    total = 0
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            name = entry.name.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(f"{entry.name!r}: the name is not UTF-8")
            continue
        if len(take) == max_files:
            skipped.append(f"{name!r} and any after it: more than {max_files} files")
            break
        if total + entry.size > max_bytes:
            skipped.append(f"{name!r}: past the outbox's {max_bytes}-byte budget")
            continue
        total += entry.size
        take.append((name, entry.size))
    return take, skipped


class ExecSession(SandboxSession):
    """The turn's container, reached by one ``docker exec`` per call (as uid 65534).

    The container carries every limit and the ``calls`` seccomp profile, so an
    exec gets them too. Calls run one at a time; after each one every process
    of the call user is killed, which is how a call's leftovers go.
    """

    def __init__(self, api: Any, channel: AttachChannel, policy: Policy, *, backend: str) -> None:
        self.policy = policy
        self.backend = backend
        #: The turn's container.
        self.container_id = channel.container_id
        self.channel = channel
        self._api = api
        self._call_lock = threading.Lock()
        self._closed = False
        self._outbox_root = Path(tempfile.mkdtemp(prefix="astralvessel-docker-outbox-"))
        self._outbox = str(policy.environment["VESSEL_OUTBOX"])

    def _exec(
        self, argv: list[str], *, limit: int = _HELPER_OUTPUT_MAX
    ) -> tuple[int | None, bytes]:
        """Run a helper command as the call user; its exit code and up to ``limit`` stdout bytes."""
        exec_id = self._api.exec_create(
            self.container_id, argv, user=f"{CALL_UID}:{CALL_UID}", workdir="/"
        )["Id"]
        attached = self._api.exec_start(exec_id, socket=True)
        output = bytearray()
        try:
            # Read to the end (the helper's exit code is wanted), keeping at most ``limit``.
            for kind, payload in frames(raw_socket(attached)):
                if kind == 1:
                    output += payload[: max(limit - len(output), 0)]
        finally:
            close_attached(attached)
        return self._api.exec_inspect(exec_id).get("ExitCode"), bytes(output)

    def prepare(self) -> None:
        """Create the outbox in the workspace."""
        code, out = self._exec(["mkdir", "-p", self._outbox])
        if code != 0:
            raise SandboxError(
                "the docker-exec container cannot prepare its workspace: "
                + out.decode(errors="replace")
            )

    def _kill_calls(self) -> None:
        # `kill -9 -1` as the call user reaches every process of that uid and nothing else.
        with contextlib.suppress(Exception):
            self._exec(["/bin/sh", "-c", "kill -9 -1"])

    def run(self, request: RunRequest) -> RunOutcome:
        """Run one call as a ``docker exec`` and wait for it (one at a time)."""
        with self._call_lock:
            if self._closed:
                raise SandboxError("the docker-exec turn is closed")
            return self._run_locked(request)

    async def arun(self, request: RunRequest) -> RunOutcome:
        """Async twin of ``run``."""
        return await asyncio.to_thread(self.run, request)

    def _run_locked(self, request: RunRequest) -> RunOutcome:
        api = self._api
        started = time.monotonic()
        try:
            exec_id = api.exec_create(
                self.container_id,
                exec_argv(self.policy, request.argv),
                user=f"{CALL_UID}:{CALL_UID}",
                workdir=request.cwd or str(self.policy.workdir),
                stdin=True,
            )["Id"]
            attached = api.exec_start(exec_id, socket=True)
        except Exception as exc:
            raise SandboxError(
                f"docker exec failed: {exc}; {self.channel.describe_exit()}"
            ) from None
        try:
            output, timed_out = self._stream(
                raw_socket(attached), request, started + request.timeout
            )
        finally:
            close_attached(attached)
        # Before the outbox is read, so nothing of the call can swap a file for a link.
        self._kill_calls()
        try:
            exit_code = None if timed_out else api.exec_inspect(exec_id).get("ExitCode")
        except Exception as exc:
            raise SandboxError(
                f"the docker engine lost the call ({exc}); {self.channel.describe_exit()}"
            ) from None
        files, skipped = self._collect_outbox()
        metadata = dict(EXEC_METADATA)
        if skipped:
            metadata["outbox_skipped"] = "; ".join(skipped)
        return RunOutcome(
            output=output.text,
            exit_code=exit_code,
            timed_out=timed_out,
            dropped_chars=output.dropped,
            files=files,
            duration=time.monotonic() - started,
            metadata=metadata,
        )

    def _stream(self, sock: Any, request: RunRequest, deadline: float) -> tuple[OutputBuffer, bool]:
        """Feed stdin, collect bounded output until the exec ends or the deadline passes."""

        def feed() -> None:
            with contextlib.suppress(OSError):
                sock.sendall(request.stdin)
                sock.shutdown(socket.SHUT_WR)

        threading.Thread(target=feed, daemon=True).start()
        output = OutputBuffer(request.output_chars)
        try:
            for kind, payload in frames(sock, deadline=deadline):
                if kind == TIMED_OUT:
                    self._kill_calls()
                    return output, True
                output.add(payload)
        finally:
            output.add(b"", final=True)
        return output, False

    def _collect_outbox(self) -> tuple[tuple[OutboxFile, ...], list[str]]:
        """Copy the outbox's files out within the budgets, then empty it for the next call."""
        try:
            code, listing = self._exec(outbox_listing_argv(self._outbox, OUTBOX_MAX_FILES))
            if code != 0:
                return (), []
            take, skipped = plan_outbox(
                parse_listing(listing),
                max_files=OUTBOX_MAX_FILES,
                max_bytes=self.policy.limits.disk_mb * 1024 * 1024,
            )
            folder = Path(tempfile.mkdtemp(dir=self._outbox_root)) if take else None
            files = []
            for name, size in take:
                assert folder is not None  # noqa: S101 - made above whenever take is not empty
                file = self._copy_out(name, size, folder / name)
                if file is None:
                    skipped.append(f"{name!r}: it changed while being copied")
                else:
                    files.append(file)
            return tuple(files), skipped
        finally:
            # Whatever was left (links, folders, files past a budget) must not reach the next call.
            self._exec(["find", self._outbox, "-mindepth", "1", "-delete"], limit=0)

    def _copy_out(self, name: str, size: int, path: Path) -> OutboxFile | None:
        """Stream one file to ``path`` (``dd`` with ``nofollow``), at most ``size`` bytes."""
        argv = ["dd", f"if={self._outbox}/{name}", "iflag=nofollow", "bs=65536", "status=none"]
        exec_id = self._api.exec_create(
            self.container_id, argv, user=f"{CALL_UID}:{CALL_UID}", workdir="/"
        )["Id"]
        attached = self._api.exec_start(exec_id, socket=True)
        written = 0
        try:
            with path.open("wb") as out:
                for kind, payload in frames(raw_socket(attached)):
                    if kind != 1:
                        continue
                    if written + len(payload) > size:
                        written = size + 1
                        break
                    out.write(payload)
                    written += len(payload)
        finally:
            close_attached(attached)
        if written != size or self._api.exec_inspect(exec_id).get("ExitCode") != 0:
            path.unlink(missing_ok=True)
            return None
        return OutboxFile(name=name, size=size, path=path)

    def file_tool(
        self, tool: str, arguments: Mapping[str, object], *, timeout: float
    ) -> FileOutcome:
        """File tools need the server, which this mode has not; say so to the model."""
        return FileOutcome(
            text=f"{tool} is unavailable in this sandbox (it runs each call as a `docker exec`, "
            "without the sandbox server the file tools need); use bash (cat, ls, find) instead",
            is_error=True,
        )

    async def afile_tool(
        self, tool: str, arguments: Mapping[str, object], *, timeout: float
    ) -> FileOutcome:
        """Async twin of ``file_tool``."""
        return self.file_tool(tool, arguments, timeout=timeout)

    def unenforced(self) -> Mapping[Promise, str]:
        """What this mode does not keep (see ``EXEC_UNENFORCED``)."""
        return dict(EXEC_UNENFORCED)

    def close(self) -> None:
        """Remove the container and the host's outbox copies. Never raises."""
        self._closed = True
        self.channel.close()
        shutil.rmtree(self._outbox_root, ignore_errors=True)
