"""The ``docker-exec`` session: each call one ``docker exec`` in the turn's container, no server.

For images without a usable ``python3`` the sandbox server cannot run, so each
call is an exec as the turn's leased host uid (65534 on an engine that maps
container uids itself) in a container that carries every limit and the
``calls`` seccomp profile. It is a second, smaller implementation of the
session API, with its own conformance run (``tests/conformance``) that declares
what it cannot keep: calls run one at a time, the file tools are unavailable,
and a call joins the container's PID namespace, where its idle first process is
visible. Everything a call controls stays bounded on the host as in server
mode: output in bytes (``OutputBuffer``), and outbox files by count and bytes,
regular files with one link only, never following a link, with the server's
note to the model about what did not come back.

Every exec holds one of the engine's ``runc`` places until its command runs,
and a call's own timeout starts then (``_exec_stream``).
"""

from __future__ import annotations

import codecs
import contextlib
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ..._ground._aio import cancelled_exception, shielded, to_thread
from ...errors import SandboxError
from .._api import (
    ExecRequest,
    ExecResult,
    FsReply,
    FsRequest,
    OutboxFile,
    RunOutcome,
    RunRequest,
    SandboxSession,
)
from .._owner import Owner
from .._policy import Policy, Promise
from .._temporary_outbox import TurnOutbox
from ..server._outbox import FILES_PER_CALL, NOT_PLAIN, NOT_UTF8, TOO_BIG, TOO_MANY
from ._attach import TIMED_OUT, AttachChannel
from ._exec_stream import ExecStream
from ._spec import CALL_UID, exec_argv, ready_argv

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
#: Outbox files one call may return, as in server mode; the rest are counted, not returned.
OUTBOX_MAX_FILES = FILES_PER_CALL
#: Outbox entries listed at most (plain files or not); the rest are only counted.
_LISTED_MAX = 4 * OUTBOX_MAX_FILES
#: Bytes of one helper command's output the host reads at most (the outbox listing).
_HELPER_OUTPUT_MAX = (_LISTED_MAX + 2) * (255 + 48)
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
    """One entry the outbox listing named: its raw name, size, and whether it is a plain file."""

    name: bytes
    size: int
    #: A regular file with one link (not a folder, a symbolic link or a hard link).
    plain: bool


def outbox_listing_argv(outbox: str, listed: int) -> list[str]:
    """A command ending the call's processes, then printing the outbox's entry count and
    ``type links/size/name\0`` per entry; an empty outbox it removes.

    The kill comes first, so nothing of the call can swap a file for a link
    once listed (``kill -9 -1`` as the call user reaches every process of that
    uid but the shell itself), then the folder and its plain files are made
    readable to their owner, the call user. Only a folder that cannot be listed writes to
    stderr (``find``'s complaint, or the shell's for a link in the folder's place,
    which it removes). ``find`` without ``-L`` follows no symbolic link
    (its type is ``l``), and the link count shows a hard link, which would let
    a call return one workspace file many times over. At most ``listed``
    entries are described; the count says how many more there were. One exec
    for all of it, not three: each costs the engine 0.1-0.2 s on a loaded host.
    """
    entries = 'find "$1" -mindepth 1 -maxdepth 1'
    return [
        "/bin/sh",
        "-c",
        # Only the count's find speaks on stderr: why the folder cannot be listed, if so.
        # A link in the folder's place is no folder: find would list nothing and say nothing.
        "kill -9 -1 2>/dev/null; "
        """if [ -L "$1" ]; then printf "'%s': Not a directory" "$1" >&2; rm -f "$1"; """
        'printf "0\\0"; exit 0; fi; '
        # The folder and its files are the call's own: one it made mode 000 is opened again
        # (nothing of the call is left to race it), so its files come back, as from a server
        # that reads them as root in its namespace. A hard link keeps a workspace file's mode.
        'chmod u+rwx "$1" 2>/dev/null; '
        f"{entries} -type f -links 1 -exec chmod u+r {{}} + 2>/dev/null; "
        f"n=$({entries} -printf . | wc -c); "
        'if [ "$n" = 0 ]; then find "$1" -delete 2>/dev/null; fi; '
        'printf "%s\\0" "$n"; '
        f'{entries} -printf "%y%n/%s/%f\\0" 2>/dev/null | head -z -n "$2"',
        "sh",
        outbox,
        str(listed),
    ]


def parse_listing(data: bytes) -> tuple[int, list[OutboxEntry]]:
    """The total entry count and the described entries; a record cut short is left out."""
    total, _, rest = data.partition(b"\0")
    entries = []
    for record in rest.split(b"\0"):
        kind_links, sep, tail = record.partition(b"/")
        size, sep2, name = tail.partition(b"/")
        if not (sep and sep2 and kind_links[1:].isdigit() and size.isdigit() and name):
            continue
        plain = kind_links[:1] == b"f" and int(kind_links[1:]) == 1
        entries.append(OutboxEntry(name=name, size=int(size), plain=plain))
    count = int(total) if total.isdigit() else len(entries)
    return max(count, len(entries)), entries


def plan_outbox(
    total: int, entries: Sequence[OutboxEntry], *, max_files: int, max_bytes: int
) -> tuple[list[tuple[str, int]], dict[str, int]]:
    """Which files to copy out (name, size), in name order, and how many were not, by reason.

    The reasons are the server's own, so the model reads the same note in both modes.
    """
    take: list[tuple[str, int]] = []
    skipped: dict[str, int] = {}

    def skip(reason: str, count: int = 1) -> None:
        skipped[reason] = skipped.get(reason, 0) + count

    total_bytes = 0
    for entry in sorted(entries, key=lambda e: e.name):
        if not entry.plain:
            skip(NOT_PLAIN)
            continue
        try:
            name = entry.name.decode("utf-8")
        except UnicodeDecodeError:
            skip(NOT_UTF8)
            continue
        if len(take) == max_files:
            skip(TOO_MANY)
        elif total_bytes + entry.size > max_bytes:
            skip(TOO_BIG)
        else:
            total_bytes += entry.size
            take.append((name, entry.size))
    if total > len(entries):
        skip(TOO_MANY, total - len(entries))
    return take, skipped


#: The bytes of a helper's stderr kept to say why it failed.
_COMPLAINT_MAX = 300


def listing_failure(code: int | None, complaint: bytes) -> str:
    """Why the outbox could not be listed: ``find``'s own words (the call's path, and why), or
    the listing's exit code."""
    said = " ".join(complaint.decode("utf-8", "replace").split())
    return said or f"the listing exited with {code}"


class ExecSession(SandboxSession):
    """The turn's container, reached by one ``docker exec`` per call (as the turn's uid).

    The container carries every limit and the ``calls`` seccomp profile, so an
    exec gets them too. Calls run one at a time; after each one every process
    of the call user is killed, which is how a call's leftovers go.
    """

    def __init__(
        self,
        api: Any,
        channel: AttachChannel,
        policy: Policy,
        *,
        backend: str,
        uid: int = CALL_UID,
        start_timeout: float = 60.0,
        etc_dir: str | None = None,
    ) -> None:
        self.policy = policy
        #: The host folder of the turn's passwd and group (``_identity``), removed at close.
        self._etc_dir = etc_dir
        #: How long an exec may wait for the engine to run it, before its own timeout starts.
        self.start_timeout = start_timeout
        #: The host uid (and gid) calls run as: the turn's own.
        self.uid = uid
        #: The call user, ``uid:gid``.
        self._user = f"{uid}:{uid}"
        self.backend = backend
        #: The turn's container.
        self.container_id = channel.container_id
        self.channel = channel
        self._api = api
        self._call_lock = threading.Lock()
        self._closed = False
        #: The process that started the container: a forked child never uses or removes it.
        self._owner = Owner()
        #: This turn's host folder of outbox files, made at the first file.
        self._turn_outbox = TurnOutbox(policy.outbox_dir, "docker-exec-outbox")
        self._outbox = str(policy.environment["VESSEL_OUTBOX"])
        self._calls = 0

    def _exec(
        self, argv: list[str], *, limit: int = _HELPER_OUTPUT_MAX
    ) -> tuple[int | None, bytes]:
        """Run a helper command as the call user; its exit code and up to ``limit`` stdout bytes."""
        code, output, _ = self._exec_both(argv, limit=limit)
        return code, output

    def _exec_both(
        self, argv: list[str], *, limit: int = _HELPER_OUTPUT_MAX
    ) -> tuple[int | None, bytes, bytes]:
        """``_exec``, with the first ``_COMPLAINT_MAX`` bytes of the helper's stderr too."""
        stream = self._start(ready_argv(argv), user=self._user, workdir="/")
        output = bytearray()
        errors = bytearray()
        try:
            # Read to the end (the helper's exit code is wanted), keeping at most ``limit``.
            for kind, payload in stream.read():
                if kind == 1:
                    output += payload[: max(limit - len(output), 0)]
                elif kind == 2:
                    errors += payload[: max(_COMPLAINT_MAX - len(errors), 0)]
        finally:
            stream.close()
        try:
            code = self._api.exec_inspect(stream.exec_id).get("ExitCode")
        except Exception as exc:
            raise SandboxError(self._lost_why("the docker engine lost a command", exc)) from None
        return code, bytes(output), bytes(errors)

    @contextlib.contextmanager
    def _watching(self, stream: ExecStream, what: str) -> Iterator[None]:
        """Read ``stream`` in the block, and close it after; ``what`` names the call or command.

        Whatever the turn's close broke is the close's doing, not the engine's: a
        broken stream, or an end that came from the container being removed under
        it (a command's 137), raises that the turn was closed while ``what`` ran.
        """
        closed = f"the docker-exec turn was closed while the {what} ran"
        try:
            yield
        except SandboxError:
            if self._closed:
                raise SandboxError(closed) from None
            self._kill_calls()  # it may run yet, unwatched: end it before the turn's next call
            raise
        finally:
            stream.close()
        if self._closed:
            raise SandboxError(closed)

    def _exit_code(self, stream: ExecStream, what: str) -> Any:
        """The exit code the engine holds for the ended ``stream``; ``what`` as ``_watching``'s."""
        try:
            return self._api.exec_inspect(stream.exec_id).get("ExitCode")
        except Exception as exc:
            raise SandboxError(
                f"the docker engine lost the {what} ({exc}); {self.channel.describe_exit()}"
            ) from None

    def _start(self, argv: list[str], **options: Any) -> ExecStream:
        """Start one exec in the turn's container (see ``ExecStream``); ``SandboxError`` if not."""
        if self._owner.forked():
            # The engine client's pooled connections are the parent's too.
            raise SandboxError(self._owner.refusal(f"this {self.backend} container"))
        try:
            return ExecStream(
                self._api,
                self.container_id,
                argv,
                start_by=time.monotonic() + self.start_timeout,
                **options,
            )
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxError(self._lost_why("docker exec failed", exc)) from None

    def _lost_why(self, what: str, exc: BaseException) -> str:
        """Why an engine request of this turn failed: a closed turn says so, else the engine."""
        if self._closed:
            return "the docker-exec turn was closed while the command ran"
        return f"{what}: {exc}; {self.channel.describe_exit()}"

    def prepare(self) -> None:
        """Create the outbox in the workspace."""
        code, _, complaint = self._exec_both(["mkdir", "-p", self._outbox])
        if code != 0:
            # mkdir says why on stderr (its stdout is empty): the engine's words, else the code.
            said = " ".join(complaint.decode(errors="replace").split())
            raise SandboxError(
                "the docker-exec container cannot prepare its workspace: "
                + (said or f"mkdir exited with {code}")
            )

    def _kill_calls(self) -> None:
        # `kill -9 -1` as the call user reaches every process of that uid and nothing else.
        with contextlib.suppress(Exception):
            self._exec(["/bin/sh", "-c", "kill -9 -1"])

    def run(self, request: RunRequest) -> RunOutcome:
        """Run one call as a ``docker exec`` and wait for it (one at a time)."""
        return self._run(request, None)

    async def arun(self, request: RunRequest) -> RunOutcome:
        """Async twin of ``run``; cancelling it kills the call."""
        cancelled = threading.Event()
        try:
            return await to_thread(self._run, request, cancelled, abandon=True)
        except cancelled_exception():
            # The worker still waits on the exec: end the call, so the worker returns and the
            # turn's next call does not queue behind it. The flag first: a call that has not
            # started yet then never starts, and one starting now is killed by its worker.
            cancelled.set()
            with shielded():
                await to_thread(self._kill_calls)
            raise

    def _run(self, request: RunRequest, cancelled: threading.Event | None) -> RunOutcome:
        with self._call_lock:
            if self._closed:
                raise SandboxError("the docker-exec turn is closed")
            if cancelled is not None and cancelled.is_set():
                raise SandboxError("the call was cancelled before it started")
            return self._run_locked(request, cancelled)

    def _run_locked(self, request: RunRequest, cancelled: threading.Event | None) -> RunOutcome:
        started = time.monotonic()
        self._calls += 1
        # Each call its own outbox folder, as in server mode.
        outbox = f"{self._outbox}/{self._calls}"
        stream = self._start(
            exec_argv(self.policy, request.argv, outbox=outbox),
            user=self._user,
            workdir=request.cwd or str(self.policy.workdir),
            stdin=True,
        )
        if cancelled is not None and cancelled.is_set():
            self._kill_calls()  # cancelled while starting: the canceller's kill may have missed it
        with self._watching(stream, "call"):
            output, timed_out = self._stream(stream, request)
        exit_code = None if timed_out else self._exit_code(stream, "call")
        files, skipped, unlisted = self._collect_outbox(outbox)
        return RunOutcome(
            output=output.text,
            exit_code=exit_code,
            timed_out=timed_out,
            dropped_chars=output.dropped,
            files=files,
            duration=time.monotonic() - started,
            metadata=dict(EXEC_METADATA),
            skipped=skipped,
            unlisted=unlisted,
        )

    def exec(self, request: ExecRequest) -> ExecResult:
        """Run a host's command as one ``docker exec``, its streams apart (one at a time)."""
        with self._call_lock:
            if self._closed:
                raise SandboxError("the docker-exec turn is closed")
            return self._exec_locked(request)

    async def aexec(self, request: ExecRequest) -> ExecResult:
        """Async twin of ``exec``; cancelling it kills the command."""
        try:
            return await to_thread(self.exec, request, abandon=True)
        except cancelled_exception():
            with shielded():
                await to_thread(self._kill_calls)
            raise

    def _exec_locked(self, request: ExecRequest) -> ExecResult:
        started = time.monotonic()
        self._calls += 1
        stream = self._start(
            exec_argv(
                self.policy,
                request.argv,
                outbox=f"{self._outbox}/{self._calls}",
                env=request.env,
                split=True,
                cwd=request.cwd or str(self.policy.workdir),
            ),
            user=self._user,
            workdir="/",
            stdin=True,
        )
        streams = {1: bytearray(), 2: bytearray()}
        cut = timed_out = False
        self._feed(stream.sock, request.stdin)
        with self._watching(stream, "command"):
            for kind, payload in stream.read(request.timeout):
                if kind == TIMED_OUT:
                    timed_out = True
                    break
                kept = streams.get(kind)
                if kept is not None:
                    room = max(0, request.output_bytes - len(kept))
                    kept += payload[:room]
                    cut = cut or len(payload) > room
        self._kill_calls()
        code = None if timed_out else self._exit_code(stream, "command")
        return ExecResult(
            returncode=code if isinstance(code, int) else -9,
            stdout=bytes(streams[1]),
            stderr=bytes(streams[2]),
            timed_out=timed_out,
            truncated=cut,
            duration=time.monotonic() - started,
        )

    @staticmethod
    def _feed(sock: Any, data: bytes) -> None:
        """Write ``data`` to an exec's stdin from a thread, then close it (output flows on)."""

        def feed() -> None:
            with contextlib.suppress(OSError):
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)

        threading.Thread(target=feed, daemon=True).start()

    def _stream(self, stream: ExecStream, request: RunRequest) -> tuple[OutputBuffer, bool]:
        """Feed stdin, collect bounded output until the exec ends or its timeout passes."""
        self._feed(stream.sock, request.stdin)
        output = OutputBuffer(request.output_chars)
        try:
            for kind, payload in stream.read(request.timeout):
                if kind == TIMED_OUT:
                    self._kill_calls()
                    return output, True
                output.add(payload)
        finally:
            output.add(b"", final=True)
        return output, False

    def _collect_outbox(self, outbox: str) -> tuple[tuple[OutboxFile, ...], dict[str, int], str]:
        """End the call's processes, copy its outbox files out within the budgets, then remove
        its folder; the files, the entries left out by why, and why the folder could not be
        listed (the model is told of both, in its own result)."""
        # The listing's exec ends the call's processes and removes an outbox left empty.
        total = -1
        try:
            code, listing, complaint = self._exec_both(outbox_listing_argv(outbox, _LISTED_MAX))
            if code != 0 or complaint:
                # A call that made its outbox unreadable (or removed it) gets no file back,
                # and is told so: an empty outbox would say it left none.
                return (), {}, listing_failure(code, complaint)
            total, entries = parse_listing(listing)
            take, skipped = plan_outbox(
                total,
                entries,
                max_files=OUTBOX_MAX_FILES,
                max_bytes=self.policy.limits.disk_mb * 1024 * 1024,
            )
            folder = self._call_folder() if take else None
            files = []
            for name, size in take:
                assert folder is not None  # noqa: S101 - made above whenever take is not empty
                file = self._copy_out(f"{outbox}/{name}", size, folder / name)
                if file is None:
                    skipped[NOT_PLAIN] = skipped.get(NOT_PLAIN, 0) + 1
                else:
                    files.append(file)
            return tuple(files), skipped, ""
        finally:
            if total != 0:
                # Whatever was left (links, folders, files past a budget) goes with the folder.
                self._exec(["find", outbox, "-delete"], limit=0)

    def _call_folder(self) -> Path:
        """A new host folder for one call's files (under the host's outbox folder, if named)."""
        return Path(tempfile.mkdtemp(prefix="call-", dir=self._turn_outbox.root()))

    def _copy_out(self, source: str, size: int, path: Path) -> OutboxFile | None:
        """Stream one file to ``path`` (``dd`` with ``nofollow``), at most ``size`` bytes."""
        argv = ["dd", f"if={source}", "iflag=nofollow", "bs=65536", "status=none"]
        stream = self._start(ready_argv(argv), user=self._user, workdir="/")
        written = 0
        try:
            with path.open("wb") as out:
                for kind, payload in stream.read():
                    if kind != 1:
                        continue
                    if written + len(payload) > size:
                        written = size + 1
                        break
                    out.write(payload)
                    written += len(payload)
        finally:
            stream.close()
        if written != size or self._api.exec_inspect(stream.exec_id).get("ExitCode") != 0:
            path.unlink(missing_ok=True)
            return None
        file = OutboxFile(name=path.name, size=size, path=path)
        return self._turn_outbox.adopt(file)

    def fs(self, request: FsRequest) -> FsReply:
        """File primitives need the server, which this mode has not.

        A file tool's view says so to the model; the host's own primitives raise
        ``BackendUnavailableError`` (the turn lives on).
        """
        if request.op != "view":
            return super().fs(request)
        return FsReply(
            fields={
                "text": "this file tool is unavailable in this sandbox (it runs each call as a "
                "`docker exec`, without the sandbox server the file tools need); use bash "
                "(cat, ls, find) instead",
                "is_error": True,
            }
        )

    async def afs(self, request: FsRequest) -> FsReply:
        """Async twin of ``fs``."""
        return self.fs(request)

    def unenforced(self) -> Mapping[Promise, str]:
        """What this mode does not keep (see ``EXEC_UNENFORCED``)."""
        return dict(EXEC_UNENFORCED)

    def close(self) -> None:
        """Remove the container; the outbox copies go too unless the host named their folder
        (or, in a temporary one, once no result names them). In a forked child it only
        marks the session closed: the container is the parent's (``sandbox._owner``)."""
        self._closed = True
        if self._owner.forked():
            return
        self.channel.close()
        self._turn_outbox.close()
        if self._etc_dir is not None:
            # A container still bound to them keeps reading them: the binds hold the files.
            shutil.rmtree(self._etc_dir, ignore_errors=True)
