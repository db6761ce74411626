"""A turn's machinery: one sandbox, one workspace, any number of calls, the host's commands.

Each host API is one flow (a generator, driven by ``web/_flow.py``'s ``run`` and
``arun``) yielding only the steps that wait: the session, a tool call's run, one
request to the session. Both faces of a pair (``exec``, ``aexec``) drive the same
flow, performing its steps in the calling thread or awaiting them (``_STEPS``):
the closed check, the session's start, the discarding of a sandbox that died and
the observe hooks are written once. ``BaseTurn`` is typed against ``TurnOwner``
(what a turn uses of its executor); the public ``Turn`` (``executor.py``) is a
``BaseTurn`` of an ``Executor``, so this module never names ``executor.py``.

Past 650 lines because it is one class: every public operation of a turn, with
the docstrings the API reference is made from; the work each one does lives in
``_exec``, ``_snapshot`` and the plans, and what is left here is its flow.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs
from typing_extensions import Self

from .._calls._plans import Call, Plan
from .._ground._aio import to_thread
from .._ground._refusals import Refusals
from .._run._runners import plan_call
from .._tools._arguments import Refusal, check_arguments, parse_arguments, unknown_tool
from ..errors import SandboxError, TurnClosedError, UsageError
from ..results import (
    ToolResult,
    render_refusal,
    render_sandbox_died,
    with_memory_notes,
    with_refusal_notes,
)
from ..sandbox._api import (
    DetachedProcess,
    ExecRequest,
    ExecResult,
    FsReply,
    FsRequest,
    finishing,
)
from ..sandbox._base import SandboxSession
from ..sandbox._owner import Owner
from ..web._flow import APerform, Flow, Perform, Step, arun, run
from . import _exec
from ._closing import Closing, refuse_if_ended
from ._exec import Listing
from ._observe import TurnWatch, byte_size
from ._snapshot._capture import capture
from ._snapshot._freeze import freeze_snapshot, freezes_here, stacks_on, store_copy
from ._snapshot._mechanism import held_stacked_lower, stacked_lower
from ._snapshot._reuse import Captures
from ._snapshot._store import MIB, Budget
from ._snapshot._value import TurnSnapshot

if TYPE_CHECKING:
    from .._calls._plans import TurnContext
    from .._ground._ledger import Ledger
    from ..registry import Registry
    from ..sandbox._api import DetachRequest
    from ..web._proxy import EgressProxy
    from ._snapshot._store import Budget

__all__ = ["BaseTurn", "TurnOwner"]

_T = TypeVar("_T")


class TurnOwner(Protocol):
    """What a turn uses of the executor that opened it (``Executor`` is one)."""

    registry: Registry
    timeout_seconds: float
    ledger: Ledger | None
    snapshot_budget: Budget

    def allowed(self, name: str) -> bool: ...

    def tool_names(self) -> list[str]: ...

    def _turn_context(self) -> TurnContext: ...

    def _start_session(
        self,
        proxy: EgressProxy | None,
        snapshot: TurnSnapshot | None,
        closing: threading.Event | None,
    ) -> tuple[SandboxSession, EgressProxy | None]: ...

    def _start_ahead(self, snapshot: TurnSnapshot, forks: int, ready: int) -> int: ...

    def _wait_ahead(
        self, snapshot: TurnSnapshot, ready: int, abandon: threading.Event | None
    ) -> None: ...


_Owner = TypeVar("_Owner", bound=TurnOwner)


class BaseTurn(Closing, Generic[_Owner]):
    """A turn opened by an ``_Owner``: all of ``Turn`` but the type of its ``executor``."""

    def __init__(self, executor: _Owner, *, snapshot: TurnSnapshot | None = None) -> None:
        #: The executor that opened the turn.
        self.executor = executor
        self._context = executor._turn_context()
        #: The files every sandbox of this turn starts with (None: an empty workspace).
        self.snapshot_source = snapshot
        #: What the turn's next snapshot may link rather than copy (``_snapshot._reuse``).
        self._captures = Captures(snapshot, store_copy)
        self._session: SandboxSession | None = None
        #: The turn's egress proxy, started with its first sandbox when the policy allows a network.
        self._proxy: EgressProxy | None = None
        #: What ends its sandboxes and proxy if the turn is collected unclosed (_start_session).
        self._finalizers: list[weakref.finalize[[], BaseTurn[_Owner]]] = []
        self._lock = threading.Lock()
        self._closed = False
        #: Set as ``close`` begins, before it takes the lock: a call holding the lock while it
        #: waits for a fork's sandbox started ahead stops waiting, so ``close`` is not held up.
        self._closing = threading.Event()
        #: The process that started the turn's sandbox (None before it starts): in a child
        #: forked from it the turn is over, and its sandbox is left to the parent.
        self._owner: Owner | None = None
        #: What the turn tells the host: logs, its ledger, its spans.
        self._watch = TurnWatch(
            backend=self._context.backend,
            policy_id=self._context.policy_id,
            ledger=executor.ledger,
        )

    @property
    def turn_id(self) -> str:
        """This turn's id, as its log events and ledger records name it."""
        return self._watch.turn_id

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """End the turn: kill everything in its sandbox and remove its workspace.

        In a process forked from the one that started the sandbox it only ends the
        turn there: the sandbox, its proxy and its outbox stay the parent's.
        """
        if self._forget_if_forked():
            return
        self._closing.set()
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
            proxy, self._proxy = self._proxy, None
            finalizers, self._finalizers = self._finalizers, []
        for finalizer in finalizers:
            finalizer.detach()
        if session is not None:
            session.close()
        if proxy is not None:
            proxy.close()
        self._watch.closed()

    @property
    def session(self) -> SandboxSession:
        """The turn's running sandbox, started now if it has not been yet.

        Raises ``TurnClosedError`` once the turn has ended, and in a process forked
        after its sandbox started (the sandbox is the parent's; see ``sandbox._owner``).
        """
        self._refuse_if_forked()
        with self._lock:
            refuse_if_ended(self._closed)
            if self._session is None:
                started = time.monotonic()
                self._session, self._proxy = self._start_session()
                self._owner = Owner()
                self._watch.sandbox_started(time.monotonic() - started, self._proxy)
            return self._session

    def _forget_if_forked(self) -> bool:
        """In a forked child, end the turn here without touching the parent's sandbox.

        Checked before the lock: a thread of the parent may have held it at the fork,
        and no thread of this process will release it.
        """
        owner = self._owner
        if owner is None or not owner.forked():
            return False
        self._closed = True
        self._session = self._proxy = None
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers = []
        return True

    def _refuse_if_forked(self) -> None:
        """``TurnClosedError`` in a child forked after the turn's sandbox started."""
        owner = self._owner
        if owner is not None and self._forget_if_forked():
            raise TurnClosedError(owner.refusal("this turn"))

    def _start_session(self) -> tuple[SandboxSession, EgressProxy | None]:
        """Start the turn's sandbox (and its proxy, the first time); the caller holds the lock."""
        session, proxy = self.executor._start_session(
            self._proxy, self.snapshot_source, self._closing
        )
        # A turn dropped without close still ends its sandbox and stops its proxy's thread
        # when it is collected: each would otherwise live as long as the host. The callbacks
        # hold the session and proxy, never the turn. Not at exit: the sandbox dies with the
        # host process anyway, and the proxy's thread is a daemon.
        ends = (
            [session.close]
            if proxy is None or proxy is self._proxy
            else [session.close, proxy.close]
        )
        for end in ends:
            finalizer = weakref.finalize(self, end)
            finalizer.atexit = False
            self._finalizers.append(finalizer)
        return session, proxy

    async def _asession(self) -> SandboxSession:
        self._refuse_if_forked()
        with self._lock:
            if self._session is not None and not self._closed:
                return self._session
        return await to_thread(lambda: self.session)

    def _discard(self, session: SandboxSession, reason: str = "") -> None:
        """Forget a sandbox that died, so the next call starts a fresh one."""
        with self._lock:
            current = self._session is session
            if current:
                self._session = None
            closed = self._closed
        session.close()
        if current and not closed:
            self._watch.sandbox_lost(reason)

    # -- calls ----------------------------------------------------------------------------

    def call(self, name: str, arguments: object = None) -> ToolResult:
        """Run one tool call; ``arguments`` is a dict or the model's raw JSON text."""
        return run(self._call_flow(name, arguments), _PERFORM)

    async def acall(self, name: str, arguments: object = None) -> ToolResult:
        """Async twin of ``call``; calls of one turn may run concurrently."""
        return await arun(self._call_flow(name, arguments), _APERFORM)

    def _call_flow(self, name: str, arguments: object) -> Flow[ToolResult]:
        with self._watch.call(name, arguments) as note:
            started = time.monotonic()
            plan = self._plan(name, arguments)
            if isinstance(plan, ToolResult):
                note.result = self._stamp(plan, str(name), None, started)
                return note.result
            session = (yield from _Session(self)) if plan.sandboxed else None
            try:
                note.ran = outcome = yield from _Run(plan, session)
            except Exception as exc:
                result = self._rescue(plan, session, exc)
            else:
                result = plan.finish(outcome)
            note.result = self._stamp(result, name, plan, started)
            return note.result

    # -- the host's own commands and files --------------------------------------------------

    def exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run ``argv`` in the turn's sandbox, confined like a tool call; stdout and stderr apart.

        ``input`` is the command's stdin; ``cwd`` a sandbox path (relative to the
        workdir); ``env`` variables set over the clean environment; ``timeout``
        defaults to the turn's tool timeout. ``user`` (a name or uid, only
        under ``root_identity``) is who the command sees itself as, looked up
        in the sandbox's own ``/etc/passwd``: every user of a turn is the same
        host identity, so it changes what the command sees, never what it can
        reach; a user the sandbox does not know is a failed result (126). A
        command that fails or times out is a normal ``ExecResult``; the host's
        mistakes (a bad argv, a NUL, a value past its bound, ``user`` without
        ``root_identity``) raise ``UsageError``, and a sandbox that died raises
        ``SandboxError`` (the turn's next use starts a fresh one); closing the
        turn meanwhile raises ``TurnClosedError``. The bounds are in
        ``docs/exec-and-files.md``.
        """
        return run(self._exec_flow(argv, input, cwd, env, timeout, user), _PERFORM)

    async def aexec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Async twin of ``exec``; many may run at once, and cancelling one kills its command."""
        return await arun(self._exec_flow(argv, input, cwd, env, timeout, user), _APERFORM)

    def _exec_flow(  # noqa: PLR0917 - exec's own arguments, passed on as they came
        self, argv: object, input: object, cwd: object, env: object, timeout: object, user: object
    ) -> Flow[ExecResult]:
        with self._watch.exec(_argv_of(argv)) as note:
            policy = self._context.policy
            request = _exec.exec_request(
                argv,
                input=input,
                cwd=cwd,
                env=env,
                timeout=timeout,
                default_timeout=self.executor.timeout_seconds,
                workdir=str(policy.workdir),
            )
            plan = _exec.exec_plan(
                request, user, root_identity=policy.root_identity, timeout=self._file_timeout()
            )
            planned = yield from self._files(plan)
            if isinstance(planned, ExecResult):
                note.result = planned
                return planned
            session = yield from _Session(self)
            try:
                note.result = with_memory_notes((yield from self._guarded(_Exec(session, planned))))
            finally:
                self._drain_refusals()  # the host's command: logged, never noted on a later call
            return note.result

    def start(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> DetachedProcess:
        """Start ``argv`` in the turn's sandbox and return once it runs, without waiting for it.

        Confined like a call (policy, limits, filter, memory watch), but it
        lives on after its command exits for as long as anything it started
        runs (a server that forks and exits keeps its daemon), until the turn
        closes, ``timeout`` seconds pass, or ``kill()``. At most
        ``DETACHED_PER_TURN`` (8) at once, each counted until everything it
        started has ended: one more raises ``UsageError``. Its stdout and stderr
        go to one log, of which the first 64 KiB are kept (``result().stdout``).
        See ``DetachedProcess`` and ``docs/exec-and-files.md``.
        """
        return run(self._start_flow(argv, input, cwd, env, timeout), _PERFORM)

    async def astart(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> DetachedProcess:
        """Async twin of ``start``."""
        return await arun(self._start_flow(argv, input, cwd, env, timeout), _APERFORM)

    def _start_flow(
        self, argv: object, input: object, cwd: object, env: object, timeout: object
    ) -> Flow[DetachedProcess]:
        request = _exec.detach_request(
            argv,
            input=input,
            cwd=cwd,
            env=env,
            timeout=timeout,
            workdir=str(self._context.policy.workdir),
        )
        session = yield from _Session(self)
        process = yield from self._guarded(_Detach(session, request))
        return finishing(process, with_memory_notes)

    def read_file(self, path: str) -> bytes:
        """The bytes of the file at sandbox ``path`` (absolute, or relative to the workdir).

        Resolved and confined like the built-in file tools, as the calls' user.
        Raises ``SandboxFileNotFoundError`` (a ``FileNotFoundError``),
        ``SandboxIsADirectoryError``, ``SandboxNotADirectoryError`` (a file on
        the way), ``SandboxPermissionError`` (outside the agent's data, or
        unreadable), ``FileTooLargeError`` past 100 MiB, and ``SandboxFileError``
        for a FIFO, socket or device (``EINVAL``) or a name too long.
        """
        return run(self._read_flow(path), _PERFORM)

    async def aread_file(self, path: str) -> bytes:
        """Async twin of ``read_file``."""
        return await arun(self._read_flow(path), _APERFORM)

    def _read_flow(self, path: str) -> Flow[bytes]:
        with self._watch.file("read", path) as note:
            data = yield from self._files(_exec.read_plan(path, timeout=self._file_timeout()))
            note.size = len(data)
            return data

    def write_file(self, path: str, data: bytes | str) -> None:
        """Write ``data`` (str as UTF-8) to the file at sandbox ``path``, replacing it.

        Missing folders on the way are made. Only under the workspace and
        writable mounts; never through a link at the name. Raises
        ``SandboxPermissionError`` elsewhere (or on a read-only place, or a mode
        the calls' user may not write), ``SandboxIsADirectoryError`` for a folder
        (a mount point too), ``SandboxNotADirectoryError`` when a file stands
        where a folder should, ``SandboxFileError`` for a link at the name
        (``ELOOP``), a FIFO or socket (``EINVAL``), a name too long or a full
        disk, and ``UsageError`` past 100 MiB.
        """
        run(self._write_flow(path, data), _PERFORM)

    async def awrite_file(self, path: str, data: bytes | str) -> None:
        """Async twin of ``write_file``."""
        await arun(self._write_flow(path, data), _APERFORM)

    def _write_flow(self, path: str, data: bytes | str) -> Flow[None]:
        with self._watch.file("write", path) as note:
            note.size = byte_size(data)
            yield from self._files(_exec.write_plan(path, data, timeout=self._file_timeout()))

    def list_dir(self, path: str = ".", *, limit: int = _exec.LIST_MAX_ENTRIES) -> Listing:
        """The entries of the folder at sandbox ``path``: ``(name, kind)`` in name order.

        ``kind`` is ``file``, ``dir``, ``link`` or ``other``. A ``Listing`` is a
        list; its ``truncated`` is true when the folder held more than ``limit``
        entries (1 to 10 000; ``UsageError`` outside), and then it holds
        ``limit`` of them, not chosen by name. A name that is not UTF-8 comes as
        ``os.listdir`` gives it (``os.fsdecode``'s escapes) and reaches the same
        file when passed back. Raises ``SandboxFileNotFoundError``,
        ``SandboxNotADirectoryError`` (a file), ``SandboxPermissionError``
        (outside the agent's data, or unlistable as the calls' user).
        """
        return run(self._list_flow(path, limit), _PERFORM)

    async def alist_dir(self, path: str = ".", *, limit: int = _exec.LIST_MAX_ENTRIES) -> Listing:
        """Async twin of ``list_dir``."""
        return await arun(self._list_flow(path, limit), _APERFORM)

    def _list_flow(self, path: str, limit: int) -> Flow[Listing]:
        with self._watch.file("list", path) as note:
            plan = _exec.list_plan(path, timeout=self._file_timeout(), limit=limit)
            listing = yield from self._files(plan)
            note.size = len(listing)
            return listing

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> TurnSnapshot:
        """The turn's files now, as an immutable value: open turns from it with
        ``executor.turn(snapshot=...)``, or ``save`` it.

        Files, not processes: the workspace (the per-call outbox aside), taken
        between calls. Not captured: running or detached processes (they keep
        running; a file one writes meanwhile may be caught half-written, or
        refuse the snapshot if it changes while read), the egress proxy's
        connections, the leased identity, the host's mounts. Its files count
        against the executor's ``snapshot_budget_mb`` while it is alive (once,
        however many live snapshots share one), its tree removed in the
        background once it is dropped. Raises
        ``SnapshotError`` for files a snapshot cannot keep (a fifo, a socket, a
        device, more names or bytes than the bounds) and ``UsageError`` under
        ``writable_root``, whose root's changes are not captured.
        """
        return run(self._snapshot_flow(), _PERFORM)

    async def asnapshot(self) -> TurnSnapshot:
        """Async twin of ``snapshot``."""
        return await arun(self._snapshot_flow(), _APERFORM)

    def _snapshot_flow(self) -> Flow[TurnSnapshot]:
        unchanged = self._unchanged_source()
        if unchanged is not None:
            return unchanged
        return (yield from self._files(self._capture_plan(), blocking=True))

    def _unchanged_source(self) -> TurnSnapshot | None:
        """The snapshot the turn opened from while no sandbox of it runs: its files are still
        that snapshot's (a sandbox that died is replaced by one restored from it)."""
        with self._lock:
            if self._session is None and not self._closed:
                return self.snapshot_source
        return None

    def fork(self, n: int, *, ready: int = 1) -> list[Self]:
        """``n`` new turns whose files start as this turn's now; this turn goes on.

        One snapshot, then ``n`` turns opened from it, each with its own sandbox
        (started ahead in the background, ``FORKS_AHEAD`` at a time), identity,
        limits and workspace: a fork's writes reach neither its siblings nor this
        turn. ``fork`` returns once ``ready`` of the forks' sandboxes are started
        (0 to ``n``; 0 returns at once): with the default 1, a call made right away
        takes a started sandbox, and later forks' first calls take one, or the one
        being started for them, or start their own; with ``ready=n`` every fork's
        first call takes a started sandbox, as a warm turn's does, and ``fork``
        takes as long as its starts. The wait is bounded (``AHEAD_WAIT`` per start)
        and ends when this turn or the executor closes; a start that fails or hangs
        never holds ``fork`` up nor raises from it (that fork's first call starts
        its own). On an executor with warm sandboxes that forks adopt
        (``Executor(warm=N)``, bubblewrap and nsjail) ``fork`` waits, unless
        ``ready`` is 0, for as many forks as there are warm sandboxes ready to
        adopt (milliseconds each), so their first calls are warm ones. Under a
        network policy no sandbox is started ahead, and ``fork`` does not wait.
        Processes are not carried. Raises what ``snapshot`` raises,
        and ``UsageError`` for an ``n`` or ``ready`` out of bounds.
        """
        return run(self._fork_flow(n, ready), _PERFORM)

    async def afork(self, n: int, *, ready: int = 1) -> list[Self]:
        """Async twin of ``fork``; cancelling it leaves the wait at once."""
        return await arun(self._fork_flow(n, ready), _APERFORM)

    def _fork_flow(self, n: int, ready: int) -> Flow[list[Self]]:
        count = _fork_count(n)
        wanted = _ready_count(ready, count)
        snapshot = yield from self._fork_source_flow()
        wanted = self.executor._start_ahead(snapshot, count, wanted)
        forks = [type(self)(self.executor, snapshot=snapshot) for _ in range(count)]
        if wanted:
            yield from _Ahead(self.executor, snapshot, wanted, self._closing)
        return forks

    def _fork_source_flow(self) -> Flow[TurnSnapshot]:
        """The snapshot forks open from: where the sandbox can, its workspace frozen in place
        (nothing copied; the turn writes on in an overlay above it), else a capture."""
        unchanged = self._unchanged_source()
        if unchanged is not None:
            return unchanged
        policy = self._context.policy
        # A turn whose capture would link (a snapshot of it alive, or its source's files)
        # copies only what changed: its freeze would count the whole workspace again.
        # A fork on a stack of root's layers freezes its own above them (nothing copied).
        below = self.snapshot_source if self._captures.stacks() else None
        below = below if stacks_on(below) else None
        if not policy.writable_root and (below is not None or not self._captures.linkable()):
            session = yield from _Session(self)
            if below is not None and not _stacks_here(session.backend):
                below = None  # its forks of a fork capture, as before
            freezing = below is not None or not self._captures.linkable()
            if freezing and freezes_here(session.backend, session):
                budget = self.executor.snapshot_budget
                frozen = yield from self._guarded(
                    _Freeze(
                        session,
                        upper_bytes=policy.limits.disk_mb * MIB,
                        budget=budget,
                        max_bytes=budget.limit_bytes,
                        max_files=policy.limits.workspace_inodes,
                        below=below,
                        lost=self._captures.lost,
                    )
                )
                if frozen is not None:
                    # The turn writes on above the layer: a capture of it links what it
                    # did not change from the layer's store copy, as a fork's does
                    # (while a fork keeps the layer: the turn holds it weakly).
                    self._captures.frozen(frozen)
                    return frozen
        return (yield from self._files(self._capture_plan(), blocking=True))

    def _capture_plan(self) -> Generator[FsRequest, FsReply, TurnSnapshot]:
        policy = self._context.policy
        if policy.writable_root:
            raise UsageError(
                "Turn.snapshot: a turn with writable_root changes its root too, which a "
                "snapshot does not capture yet; snapshot a turn without it"
            )
        budget = self.executor.snapshot_budget
        return capture(
            timeout=self._file_timeout(),
            max_bytes=budget.limit_bytes,
            max_files=policy.limits.workspace_inodes,
            budget=budget,
            captures=self._captures,
        )

    # -- the steps every flow shares ----------------------------------------------------------

    def _file_timeout(self) -> float:
        return max(self.executor.timeout_seconds, 30.0)

    def _files(
        self, plan: Generator[FsRequest, FsReply, _T], *, blocking: bool = False
    ) -> Flow[_T]:
        """Run a file plan's requests on the turn's session, each one guarded.

        ``blocking``: the plan's own work between requests is long (a capture writes
        the store's trees, digests every file, copies a frozen layer once), so the
        async face runs each of its steps on a worker thread, not the event loop's.
        """
        try:
            request = next(plan)  # checks the host's arguments before a sandbox starts
        except StopIteration as done:  # a plan that needs no step
            return done.value  # type: ignore[no-any-return]
        session = yield from _Session(self)
        while True:
            reply = yield from self._guarded(_Fs(session, request))
            if blocking:
                advanced = yield from _Advance(plan, reply)
            else:
                advanced = _advance(plan, reply)
            if advanced.done:
                return advanced.value  # type: ignore[no-any-return]
            request = advanced.value

    def _guarded(self, step: _Ask[_T]) -> Flow[_T]:
        """One request to the session; a sandbox that died is discarded and its error raised."""
        try:
            return (yield from step)
        except SandboxError as error:
            self._lost(step.session, error)
            raise

    def _lost(self, session: SandboxSession, error: SandboxError) -> None:
        """Discard the sandbox a step lost; raise ``TurnClosedError`` if the turn was closed.

        A turn closed while the step ran (from another thread or task) is the
        host's own doing, not a failed sandbox: that step raises
        ``TurnClosedError``, as any later use of the turn does.
        """
        self._discard(session, str(error))
        with self._lock:
            closed = self._closed
        if closed:
            raise TurnClosedError(
                "this turn was closed while the command or file operation ran; "
                "open a new one with executor.turn()"
            ) from error

    def _plan(self, name: str, arguments: object) -> Plan[Any] | ToolResult:
        """Check the call and choose its runner (pure but for the registry lookup)."""
        executor = self.executor
        if not isinstance(name, str) or not executor.allowed(name):
            return render_refusal(unknown_tool(name, executor.tool_names()))
        spec = executor.registry[name]
        try:
            args = parse_arguments(name, arguments)
            check_arguments(spec, args)
        except Refusal as refusal:
            return render_refusal(str(refusal))
        timeout = spec.timeout_seconds or executor.timeout_seconds
        return plan_call(self._context, spec, Call(tool=name, arguments=args, timeout=timeout))

    def _rescue(
        self, plan: Plan[Any], session: SandboxSession | None, exc: Exception
    ) -> ToolResult:
        """The result for a call whose step raised, or the exception again if it is the host's."""
        if isinstance(exc, SandboxError) and session is not None:
            # The sandbox died (or broke protocol): this call cannot be retried in it,
            # and every later call would fail the same way.
            self._discard(session, str(exc))
            return render_sandbox_died(str(exc))
        result = plan.rescue(exc)
        if result is None:
            raise exc
        return result

    def _stamp(
        self, result: ToolResult, name: str, plan: Plan[Any] | None, started: float
    ) -> ToolResult:
        """Every result names its tool and duration; one that ran in the sandbox, which one,
        and the connections the turn's egress proxy refused while it ran."""
        sandboxed = plan is not None and plan.sandboxed
        if sandboxed:
            result = with_refusal_notes(result, self._drain_refusals())
        return attrs.evolve(
            result,
            tool=name,
            duration=result.duration or time.monotonic() - started,
            backend=self._context.backend if sandboxed else None,
            policy_id=self._context.policy_id if sandboxed else None,
        )

    def _drain_refusals(self) -> Refusals:
        """What the turn's proxy refused since the last call ended (nothing without a proxy).

        The proxy serves the whole turn: under concurrent calls, a refusal goes to
        whichever call ends first after it.
        """
        proxy = self._proxy
        return Refusals() if proxy is None else proxy.drain()


def _stacks_here(backend: str) -> bool:
    """Whether a fork of a fork on ``backend`` freezes its own layer and stacks it over its
    source's: root's staged layers (bubblewrap, nsjail), an ordinary user's held ones
    (Docker's too: ``freezes_here`` then checks its channel passes them and its reader
    reads them)."""
    return stacked_lower(backend) or (os.geteuid() != 0 and held_stacked_lower(backend))


def _fork_count(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"Turn.fork takes a whole number of turns above 0, not {n!r}")
    return n


def _ready_count(ready: object, forks: int) -> int:
    if isinstance(ready, bool) or not isinstance(ready, int) or not 0 <= ready <= forks:
        raise UsageError(
            f"Turn.fork's ready is how many forks' sandboxes to wait for, a whole number "
            f"from 0 to n ({forks}), not {ready!r}"
        )
    return ready


def _argv_of(argv: object) -> Sequence[object]:
    """``argv`` as the watch names it (the checks that refuse a bad one come after)."""
    return argv if isinstance(argv, (list, tuple)) else ()


# -- the steps a flow yields, and how each face performs them ---------------------------------


@attrs.frozen
class _Session(Step[SandboxSession]):
    """The turn's running sandbox, started now if it has not been (``BaseTurn.session``)."""

    turn: BaseTurn[Any]


@attrs.frozen
class _Run(Step[Any]):
    """A tool call's one blocking step: its plan run on the session (None: on the host)."""

    plan: Plan[Any]
    session: SandboxSession | None


@attrs.frozen
class _Ahead(Step[None]):
    """Wait (bounded, never raising) for ``ready`` forks' sandboxes started ahead, or
    until ``closing`` is set (the forked turn closing)."""

    executor: TurnOwner
    snapshot: TurnSnapshot
    ready: int
    closing: threading.Event


@attrs.frozen
class _Advanced:
    """A plan's next request (``done`` false), or its result (``done`` true)."""

    done: bool
    value: Any


def _advance(plan: Generator[FsRequest, FsReply, Any], reply: FsReply) -> _Advanced:
    # StopIteration cannot leave a worker thread as itself (a coroutine turns it into
    # RuntimeError), so the plan's end is a value here.
    try:
        return _Advanced(False, plan.send(reply))
    except StopIteration as done:
        return _Advanced(True, done.value)


@attrs.frozen
class _Advance(Step[_Advanced]):
    """One step of a file plan's host-side work, given the sandbox's reply."""

    plan: Generator[FsRequest, FsReply, Any]
    reply: FsReply


@attrs.frozen
class _Ask(Step[_T]):
    """One request to the turn's sandbox; a flow makes it through ``BaseTurn._guarded``."""

    session: SandboxSession


@attrs.frozen
class _Exec(_Ask[ExecResult]):
    request: ExecRequest


@attrs.frozen
class _Detach(_Ask[DetachedProcess]):
    request: DetachRequest


@attrs.frozen
class _Fs(_Ask[FsReply]):
    request: FsRequest


@attrs.frozen
class _Freeze(_Ask["TurnSnapshot | None"]):
    """The turn's workspace frozen in place as a snapshot (``_snapshot._freeze``), or None."""

    upper_bytes: int
    budget: Budget
    max_bytes: int
    max_files: int
    below: TurnSnapshot | None = None
    lost: Callable[[], None] | None = None

    def made(self) -> TurnSnapshot | None:
        return freeze_snapshot(
            self.session,
            upper_bytes=self.upper_bytes,
            budget=self.budget,
            max_bytes=self.max_bytes,
            max_files=self.max_files,
            below=self.below,
            lost=self.lost,
        )


#: Each step as the sync face performs it and as the async face awaits it: the only
#: lines in which the twins differ.
_STEPS: dict[type[Step[Any]], tuple[Callable[[Any], Any], Callable[[Any], Awaitable[Any]]]] = {
    _Session: (lambda s: s.turn.session, lambda s: s.turn._asession()),
    _Run: (lambda s: s.plan.run(s.session), lambda s: s.plan.arun(s.session)),
    # Waiting changes nothing, so a cancelled ``afork`` leaves the wait at once.
    _Ahead: (
        lambda s: s.executor._wait_ahead(s.snapshot, s.ready, s.closing),
        lambda s: to_thread(s.executor._wait_ahead, s.snapshot, s.ready, s.closing, abandon=True),
    ),
    _Exec: (lambda s: s.session.exec(s.request), lambda s: s.session.aexec(s.request)),
    _Detach: (lambda s: s.session.detach(s.request), lambda s: s.session.adetach(s.request)),
    _Fs: (lambda s: s.session.fs(s.request), lambda s: s.session.afs(s.request)),
    # Its host's half (the listing, the digests) is blocking work: a thread's, as awaited.
    _Freeze: (lambda s: s.made(), lambda s: to_thread(s.made)),
    # A capture's host half (tree writes, digests, a layer's copy), off the event loop;
    # a cancelled await lets the step finish (never two threads in one generator).
    _Advance: (
        lambda s: _advance(s.plan, s.reply),
        lambda s: to_thread(_advance, s.plan, s.reply),
    ),
}
_PERFORM: Perform = {kind: sync for kind, (sync, _) in _STEPS.items()}
_APERFORM: APerform = {kind: awaited for kind, (_, awaited) in _STEPS.items()}
