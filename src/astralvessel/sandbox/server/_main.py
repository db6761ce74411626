"""The sandbox server's event loop (stdlib only, Python 3.8+).

One thread, one selector loop (``_lean.Selector``): frames from the host, each call's output
pipe and stdin pipe, the file worker's replies and a SIGCHLD wake-up pipe. A
single thread means every fork happens in a single-threaded process, so the
Python code that runs between fork and exec cannot deadlock on a lock another
thread held, and frames to the host never interleave.

A confining server forks every call's namespaces through its zygote (see
``_zygote``) and keeps one *spare*: a call's namespaces and init built ahead
of time, init waiting for its request (see ``_launch``). A call takes the
spare; the next one is ordered a moment after the answer, or while the call
runs if the host calls back to back, so the forks stay off the call's critical
path. A call that finds no spare (it died, or none could be built) has one
built on demand.

``Server`` is one state machine over one loop: every handler reads and writes the same
calls, so they stay here (which is why this module, alone in the package, is past 650
lines: cutting the machine in two would share its state across modules). What stands
alone lives beside it: the wire format (``_protocol``) and its messages (``_messages``),
a call's values, its outcome and its exit frame (``_calls``), its pipes (``_pipes``),
where its processes come from (``_spawner``, ``_zygote``, ``_launch``), the turn's setup
from the hello (``_hello``), the file worker's queue (``_fsqueue``, ``_worker``,
``_files``), the outbox (``_outbox``) and the memory watch's measures (``_bounds``).
"""

from __future__ import annotations

import errno
import os
import time

from . import (
    _adopt,
    _bounds,
    _freeze,
    _fsqueue,
    _hello,
    _launch,
    _messages,
    _outbox,
    _passfd,
    _pipes,
    _protocol,
    _spawner,
    _sys,
)
from ._calls import Call, RunOrder, exit_frame, map_path, outcome, parse_run, refusal, status_values
from ._lean import EVENT_READ, EVENT_WRITE, Selector, signal, suppress

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["Server", "main"]

# After a call's process is reaped, how long to wait for its output pipe to close.
_DRAIN_NAMESPACE = 5.0
_DRAIN_GROUP = 0.5
# A call that comes this soon after the last answer means the host calls back to back.
_BACK_TO_BACK = 0.01
# How long after an answer the next spare's forks wait, so the host gets the CPUs first.
_REFILL_DELAY = 0.003


class Server:
    """The server's state and loop; ``main`` builds one on the host's pipes."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd
        #: The host's unix socket (Docker's direct channel), which carries descriptors
        #: (``_passfd``); None over pipes.
        self.host = _passfd.host_socket(rfd)
        #: Descriptors the host passed, not yet taken (a hello's frozen layer).
        self.passed: list[int] = []
        self.decoder = _protocol.FrameDecoder()
        self.selector = Selector()
        self.calls: dict[int, Call] = {}
        self.running = True
        self.config: _messages.Hello | None = None
        self.plan: _launch.LaunchPlan | None = None
        self.path_map: dict[str, str] = {}
        self.env: dict[str, str] = {}
        #: The file worker's requests (``fs``), one at a time (see ``_fsqueue``).
        self.files = _fsqueue.FsQueue(self.send, self.selector, lambda: self.running)
        #: The folder under which each call gets its outbox (``_outbox``).
        self.outbox = ""
        #: Starts each call, on the spare or a chain of its own (see ``_spawner``); set by hello.
        self.spawner: _spawner.Spawner | None = None
        #: The egress relay's pid, when the turn allows a network (see ``_relay``).
        self.relay: int | None = None
        #: When the last call's exit frame went out (``time.monotonic``).
        self.last_answer = float("-inf")
        #: When to build the next spare, if one is due (``time.monotonic``).
        self.refill_at: float | None = None
        #: When to sample the calls' memory next, while calls run (``time.monotonic``).
        self.memory_at: float | None = None
        #: The turn's memory group's count of OOM kills, where it has one (``_bounds``).
        self.oom_fd: int | None = None
        #: The same group's limit (``_bounds.group_limit``), for the note of a call it stopped.
        self.limit_fd: int | None = None
        #: The frozen workspace's clones the host has yet to take (``_freeze``), by number.
        self.frozen: set[int] = set()
        #: The workspace tmpfs's detached original, where the server made it (``_heldfs``:
        #: an ordinary user's freeze hands it to the host); -1: none.
        self.held_workspace = -1
        #: The upper folder of the overlay laid on a fork's layers (at hello on a bound
        #: lower, or at an adoption), for a freeze of that layer alone (``Freeze.stack``);
        #: -1: none, or frozen already.
        self.fork_upper = -1
        #: The layers the fork's overlay lies on (``O_PATH``, top first): its freeze lays
        #: the next one on its own frozen layer over them, flat (``_freeze.freeze_fork``).
        self.fork_lowers: list[int] = []
        #: What the host asked of this sandbox first (a call, a file request, an
        #: adoption), which rules out an adoption; empty: nothing yet.
        self.touched = ""
        #: ``touched`` as it was before the request being dispatched.
        self.touched_before = ""
        #: The socket a fork's frozen layer comes on (``_adopt``), until first touched.
        self.adopt_socket: int | None = None
        #: The workspace's tmpfs, whose fullness each call's answer reports (``_bounds``);
        #: None where the workspace is a host folder the backend mapped.
        self.disk_path: str | None = None

    # -- host I/O ------------------------------------------------------------

    def send(self, header: dict[str, Any], body: bytes = b"") -> None:
        """Write one frame to the host (blocking: the host always reads).

        A header's ``pass_fd`` (the server's own, not sent) is a descriptor passed with the
        frame over the host's socket (``_passfd``; a freeze's ``passed`` answer)."""
        passed = header.pop("pass_fd", None)
        data = _protocol.encode(header, body)
        if passed is not None and self.host is not None:
            data = data[_passfd.send(self.host, data, passed) :]
        _launch._write_all(self.wfd, data)

    def fail(self, call_id: int | None, message: str) -> None:
        """Report a protocol or internal failure; without an id it ends the server."""
        self.send({"type": "error", "id": call_id, "message": message})
        if call_id is None:
            self.running = False

    # -- loop ------------------------------------------------------------------

    def serve(self) -> None:
        """Run until the host says shutdown or goes away, then kill every call."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(wake_w)
        os.set_blocking(self.rfd, False)
        self.selector.register(self.rfd, EVENT_READ, self._on_host)
        self.selector.register(wake_r, EVENT_READ, self._on_wake)
        try:
            while self.running:
                for key, events in self.selector.select(self._next_timeout()):
                    key.data(key.fd, events)
                self._check_deadlines()
                self._watch_memory()
                if self.refill_at is not None and time.monotonic() >= self.refill_at:
                    self._refill_spare()
        except BrokenPipeError:
            pass  # the host is gone: nobody to report to
        finally:
            self._stop_everything()

    def _next_timeout(self) -> float | None:
        deadlines = [
            c.drain_deadline if c.drain_deadline is not None else c.deadline
            for c in self.calls.values()
        ]
        # A detached call without a timeout has none (selectors cannot wait forever by number).
        deadlines = [d for d in deadlines if d != float("inf")]
        busy = self.files.deadline()
        if busy is not None:
            deadlines.append(busy)
        if self.refill_at is not None:
            deadlines.append(self.refill_at)
        if self.memory_at is not None:
            deadlines.append(self.memory_at)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _on_host(self, fd: int, events: int) -> None:
        try:
            if self.host is None:
                data = os.read(fd, _pipes.READ_SIZE)
            else:
                data, fds = _passfd.receive(self.host, _pipes.READ_SIZE)
                self.passed.extend(fds)
        except BlockingIOError:
            return
        if not data:
            self.running = False
            return
        self.decoder.feed(data)
        while self.running:
            try:
                frame = self.decoder.next()
            except _protocol.ProtocolError as exc:
                self.fail(None, f"malformed frame from the host: {exc}")
                return
            if frame is None:
                break
            self._dispatch(*frame)
        if self.config is not None:
            # Only a hello takes one: any other is closed, so no call inherits it.
            while self.passed:
                with suppress(OSError):
                    os.close(self.passed.pop())

    def _dispatch(self, header: dict[str, Any], body: bytes) -> None:
        """Read the frame as its type's message (``_messages.READERS``) and answer it with
        this type's handler (``_REQUESTS``); refuse it if it may not come now."""
        kind = header["type"]
        raw_id = header.get("id")
        call_id = raw_id if isinstance(raw_id, int) and not isinstance(raw_id, bool) else None
        if kind != "hello" and self.config is None:
            self.fail(None, f"expected 'hello' first, got {kind!r}")
        elif kind == "shutdown":
            self.running = False
        elif call_id is None and kind != "hello":
            self.fail(None, f"{kind!r} request without an integer 'id'")
        elif kind not in _REQUESTS:
            self.fail(call_id, f"unknown request type {kind!r}")
        else:
            try:
                message = _messages.READERS[kind].from_json(header)
            except (TypeError, ValueError) as exc:
                self.fail(call_id, str(exc))
                return
            if kind != "hello":
                self._touch(kind)
            _REQUESTS[kind](self, call_id, message, body)

    def _touch(self, kind: str) -> None:
        """Note each request after hello: once any came, no fork may adopt this sandbox,
        and the adoption socket goes (nothing may come on it later)."""
        self.touched_before = self.touched
        if not self.touched:
            self.touched = f"a {kind!r} request"
        socket_fd = self.adopt_socket
        if socket_fd is not None and kind != "adopt":
            self.adopt_socket = None
            with suppress(OSError):
                os.close(socket_fd)

    def _file_op(self, call_id: int, message: _messages.FileOp, body: bytes) -> None:
        self.files.submit(call_id, message, body)

    def _freeze(self, call_id: int, message: _messages.Freeze, body: bytes) -> None:
        """Freeze the workspace or release a clone (``_freeze``), in order with the file
        requests."""
        config, plan = self._configured()
        if message.phase == "release":
            self.files.submit_local(call_id, lambda: _freeze.release(self.frozen, message.fd))
            return
        if message.phase == "prepare":  # the host freezes (Docker's): only the refusals
            self.files.submit_local(
                call_id,
                lambda: self._calls_running() or _freeze.prepared(config, plan, self.path_map),
            )
            return
        if message.phase == "frozen":
            self.files.submit_local(call_id, self._host_froze)
            return
        if message.passed and self.host is None:
            self.files.submit_local(
                call_id,
                lambda: _freeze.refused(errno.EOPNOTSUPP, "no socket to pass a descriptor on"),
            )
            return
        self.files.submit_local(
            call_id,
            lambda: _passing(message.passed, self._frozen_answer(config, plan, message)),
        )

    def _frozen_answer(
        self, config: _messages.Hello, plan: _launch.LaunchPlan, message: _messages.Freeze
    ) -> dict[str, Any]:
        running = self._calls_running()
        if running is not None:
            return running
        if message.stack and self.fork_upper < 0:
            why = "the workspace is no overlay laid at hello on the host's layers (or frozen)"
            return _freeze.refused(errno.EOPNOTSUPP, why)
        return _freeze.answer(
            config,
            plan,
            self.path_map,
            message.upper_bytes,
            self._after_freeze,
            upper_to=self._upper_after_freeze,
            held=self.held_workspace,
            held_only=message.held,
            fork_upper=self.fork_upper if message.stack else -1,
            fork_lowers=self.fork_lowers,
        )

    def _calls_running(self) -> dict[str, Any] | None:
        """A freeze's refusal while any call or detached process runs (None: none does).

        Each keeps the mount namespace it copied, where the workspace would be the frozen
        one: its later writes would fail (EROFS) under a process the host expects to go on.
        A call's processes all end with it (its init is its PID namespace's first)."""
        running = sum(1 for call in list(self.calls.values()) if self._still_running(call))
        if not running:
            return None
        return _freeze.refused(
            errno.EBUSY,
            f"{running} call(s) or detached process(es) still run, which would keep the "
            "workspace as it was frozen",
        )

    def _after_freeze(self, clone: int) -> None:
        """After a freeze: hold the clone; what copied the old view is made again."""
        self.frozen.add(clone)
        if self.fork_upper >= 0:  # frozen now (its layer, or the tmpfs holding it)
            for fd in (self.fork_upper, *self.fork_lowers):
                with suppress(OSError):
                    os.close(fd)
            self.fork_upper = -1
            self.fork_lowers = []
            if self.held_workspace >= 0 and clone != self.held_workspace:
                # The held tmpfs's layer is the host's now; the tmpfs itself is frozen.
                with suppress(OSError):
                    os.close(self.held_workspace)
                self.held_workspace = -1
        if clone == self.held_workspace:
            self.held_workspace = -1  # the host's to take now, then released as a clone
        self._old_view_retired()

    def _host_froze(self) -> dict[str, Any]:
        """After the host's own step of a freeze (Docker's), laid or not: what copied the
        view before it is made again (a restart more, where nothing was laid). The new upper
        layer is the host's, detached, so a later snapshot of the turn reads every file."""
        self._old_view_retired()
        return {}

    def _old_view_retired(self) -> None:
        # Whatever kept a mount namespace of its own copied the old view, where the
        # workspace is now read-only: the file worker starts again with the next request,
        # the spare's namespaces are made again (the zygote shares this process's view).
        self.files.retire()
        spawner = self.spawner
        if spawner is not None and spawner.spare is not None:
            spawner.close_spare()
            self.refill_at = time.monotonic() + _REFILL_DELAY

    def _upper_after_freeze(self, upper: int) -> None:
        """The frozen workspace's new upper layer, for the file worker's listing (as a
        turn opened on a snapshot's tree gives it): a snapshot then marks every file it
        does not hold the frozen layer's, which the host links rather than reads."""
        options = self.files.options
        self.files.options = {**options, "context": {**options["context"], "upper": upper}}

    def _adopt(self, call_id: int, message: _messages.Adopt, body: bytes) -> None:
        """Lay the workspace on the fork's frozen layers (``_adopt``), in order with the
        file requests; refused unless this is the first request the sandbox had."""
        config, plan = self._configured()
        earlier = self.touched_before
        if message.laid:
            self.files.submit_local(call_id, lambda: self._adopted_laid(config, plan, earlier))
            return
        self.files.submit_local(call_id, lambda: self._adopted(config, plan, earlier))

    def _adopted(
        self, config: _messages.Hello, plan: _launch.LaunchPlan, earlier: str
    ) -> dict[str, Any]:
        socket_fd, self.adopt_socket = self.adopt_socket, None
        try:
            why = _adopt.refusal(config, plan, self.path_map, earlier)
            if why is not None:
                return dict(why)
            try:
                layers = _adopt.take_layers(socket_fd)
            except OSError as exc:
                return _freeze.refused(exc.errno or errno.EIO, str(exc))
            # What copied the old view (the spare's namespaces) must not serve a call.
            self._old_view_retired()
            try:
                upper = _adopt.lay(config, self.path_map, layers, self.fork_lowers)
            except OSError as exc:
                return _freeze.refused(exc.errno or errno.EIO, f"cannot lay the overlay: {exc}")
            finally:
                for layer in layers:  # their clones are laid (or could not be)
                    os.close(layer)
        finally:
            if socket_fd is not None:
                with suppress(OSError):
                    os.close(socket_fd)
        return self._views_remade(config, plan, upper)

    def _adopted_laid(
        self, config: _messages.Hello, plan: _launch.LaunchPlan, earlier: str
    ) -> dict[str, Any]:
        """An adoption whose overlay the host laid on the workspace itself (``Adopt.laid``):
        refused as any adoption is (touched, not adoptable), and where nothing was laid or
        a layer was passed all the same; else the outbox and views are made on it."""
        socket_fd, self.adopt_socket = self.adopt_socket, None
        try:
            why = _adopt.refusal(config, plan, self.path_map, earlier)
            if why is not None:
                return dict(why)
            try:
                _adopt.nothing_passed(socket_fd)
                _adopt.check_laid(config, self.path_map)
            except OSError as exc:
                return _freeze.refused(exc.errno or errno.EIO, exc.strerror or str(exc))
        finally:
            if socket_fd is not None:
                with suppress(OSError):
                    os.close(socket_fd)
        self._old_view_retired()
        try:
            _adopt.made_ready(config, self.path_map)
        except OSError as exc:
            return _freeze.refused(exc.errno or errno.EIO, f"cannot make the outbox: {exc}")
        # The upper layer is the host's (it lists the fork's names itself, and freezes it).
        return self._views_remade(config, plan, -1)

    def _views_remade(
        self, config: _messages.Hello, plan: _launch.LaunchPlan, upper: int
    ) -> dict[str, Any]:
        """After an adoption laid the workspace: the file worker and the spare call's
        namespaces made on the new view (``upper``: the fork's own layer, -1: none held)."""
        if self.held_workspace >= 0 and upper < 0:
            # The overlay covers the held tmpfs, as a cold fork's covers the launcher's:
            # a later freeze of this fork takes the overlay, never the empty tmpfs below.
            # Kept under a fork's overlay (as at a fork's hello; Docker's too): its own
            # layer, the upper folder there, is cloned from it when it freezes
            # (``freeze_fork``).
            with suppress(OSError):
                os.close(self.held_workspace)
            self.held_workspace = -1
        if upper >= 0:
            self.fork_upper = os.dup(upper)  # as at hello: a fork's own layer to freeze
        workspace = map_path(config.workspace, self.path_map)
        self.files.options = _hello.worker_options(config, plan, workspace, self.outbox, upper)
        # The next call's namespaces now, on the new view: the fork's first call comes as
        # this answer lands, and should find them started, as a warm turn's first does.
        self._refill_spare()
        return {"workspace_lower": True}

    def _cancel(self, call_id: int, message: _messages.Cancel, body: bytes) -> None:
        call = self.calls.get(call_id)
        if call is not None and call.drain_deadline is None and self._still_running(call):
            call.cancelled = True
            self._kill(call)

    # -- hello -----------------------------------------------------------------

    def _hello(self, call_id: None, config: _messages.Hello, body: bytes) -> None:
        if self.config is not None:
            self.fail(None, "a second 'hello'")
            return
        if self.host is not None and config.workspace_lower_fd is not None:
            # Over a socket the layer is passed with the hello, whatever number the host's
            # is; none passed: no layer (the host copies the files in).
            # A stack's layers below it come next, top first (an ordinary user's Docker
            # fork of a fork); fewer than named: none is laid (the host copies the files in).
            wanted = 1 + len(config.workspace_below_fds)
            layers = [self.passed.pop(0) for _ in range(min(wanted, len(self.passed)))]
            if len(layers) < wanted:
                for fd in layers:
                    os.close(fd)
                layers = []
            fields = dict(
                config.fields(),
                workspace_lower_fd=layers[0] if layers else None,
                workspace_below_fds=layers[1:],
            )
            config = _messages.Hello(**fields)
        if self.host is not None and config.adopt_socket is not None:
            # Docker's adoption socket comes the same way, after any layer (the two never
            # come together); none passed: this sandbox is never adopted.
            socket_fd = self.passed.pop(0) if self.passed else None
            config = _messages.Hello(**dict(config.fields(), adopt_socket=socket_fd))
        self.config = config
        self.adopt_socket = config.adopt_socket
        if self.adopt_socket is not None:
            os.set_inheritable(self.adopt_socket, False)
        self.path_map = config.path_map
        self.env = {k: map_path(v, self.path_map) for k, v in config.env.items()}
        plan, problems = _hello.launch_plan(config)
        # What the probe alone found, for the host to hand later turns (not this turn's own
        # checks below, which each turn makes again).
        probe_found = dict(problems)
        self.plan = plan
        self.oom_fd = _bounds.oom_counter(config.memory_events)
        self.limit_fd = _bounds.limit_reader(config.memory_limits)
        self.spawner = _spawner.Spawner(plan, self.env, config.root_identity)
        workspace = map_path(config.workspace, self.path_map)
        outbox = map_path(config.outbox, self.path_map)
        # Before anything copies the view (the outbox, the file worker, a call's namespaces).
        self.held_workspace = _hello.hold_workspace(config, plan, workspace)
        problems.update(_hello.workspace_problems(config, plan, workspace))
        if plan.confine and workspace == config.workspace:
            # A mapped workspace is a host folder the backend chose, not the sandbox's tmpfs.
            self.disk_path = workspace
        # The overlay first: the outbox and the writable root's layers are made in it.
        try:
            lowered, upper = _hello.lower_workspace(config, plan, workspace, self.fork_lowers)
        finally:
            _hello.close_passed_lower(config)
        if lowered.get("workspace_lower") is True:
            _hello.clear_lower_outbox(outbox)
            if upper >= 0:  # over the host's layers, staged or held
                self.fork_upper = os.dup(upper)  # the file worker's copy goes with it
        _hello.prepare_workspace(workspace, outbox, config.drop_uid, config.drop_gid)
        relaxations = {**lowered, **_hello.relaxations(config, plan, workspace)}
        self.outbox = outbox
        self.files.path_map = self.path_map
        # The file worker starts with the first file request (see _fsqueue).
        self.files.options = _hello.worker_options(config, plan, workspace, outbox, upper)
        self.files.idle_limit = float(config.file_worker_idle)
        self.relay, egress = _hello.start_relay(config, plan)
        self.send(_hello.ready_frame(plan, egress, problems, relaxations, probe_found))
        # The first spare, like every next one, waits a moment: the host has the CPUs to
        # return the turn, and a turn closed at once (a probe's, a cancelled one) forks no
        # zygote and no chain only to kill them. A call that comes first takes its own.
        self.refill_at = time.monotonic() + _REFILL_DELAY

    def _configured(self) -> tuple[_messages.Hello, _launch.LaunchPlan]:
        if self.config is None or self.plan is None:
            raise RuntimeError("the server is used before hello")
        return self.config, self.plan

    def _source(self) -> _spawner.Spawner:
        if self.spawner is None:
            raise RuntimeError("the server is used before hello")
        return self.spawner

    def _refill_spare(self) -> None:
        """Build the next call's namespaces now, unless one is ready or the server stops."""
        self.refill_at = None
        if self.running and self.spawner is not None:
            self.spawner.refill()

    # -- calls -----------------------------------------------------------------

    def _run(self, call_id: int, message: _messages.Run, body: bytes) -> None:
        config, plan = self._configured()
        try:
            order = parse_run(message, body, config.workdir)
        except (TypeError, ValueError) as exc:
            self.fail(call_id, str(exc))
            return
        if not self._may_run(call_id, order, plan):
            return
        argv = [map_path(a, self.path_map) if a.startswith("/") else a for a in order.argv]
        # A call before the first spare was due: it builds its own chain, and the next spare
        # comes after its answer (or now, for calls back to back), not while it runs.
        self.refill_at = None
        cwd = map_path(order.cwd, self.path_map)
        split = order.split
        try:
            outbox = _outbox.prepare(self.outbox, call_id, config.drop_uid, config.drop_gid)
        except OSError as exc:
            self.fail(call_id, f"cannot make the call's outbox: {exc}")
            return
        # Each call its own outbox: calls running at once never take each other's files.
        # An exec's own variables first: the call's outbox is the server's to name.
        extra_env = dict(order.env, VESSEL_OUTBOX=outbox)
        try:
            spawned = self._source().spawn(order, argv, cwd, extra_env)
        except OSError as exc:
            self._drop_outbox(call_id)
            self.fail(call_id, str(exc))
            return
        call = Call(call_id, spawned, order)
        self._mark_bounds(call)
        self.calls[call_id] = call
        self._watch(spawned.output, EVENT_READ, lambda c: self._pump(c, "stdout"), call)
        if split:
            self._watch(spawned.errors, EVENT_READ, lambda c: self._pump(c, "stderr"), call)
        elif spawned.errors >= 0:
            os.close(spawned.errors)  # a tool call's stderr shares the output pipe
            spawned.errors = -1
        body = order.stdin
        if not spawned.group:
            # The end of a namespace call comes on the status pipe (init's ``D``).
            self._watch(spawned.status, EVENT_READ, self._on_status, call)
        if body:
            call.stdin = memoryview(body)
            # A body that fits the pipe (a tool's arguments) goes now, without a wait for
            # the pipe to be writable on the call's path; only a rest is watched for.
            _pipes.feed_stdin(call, self.selector)
            if spawned.stdin >= 0:
                self._watch(
                    spawned.stdin, EVENT_WRITE, lambda c: _pipes.feed_stdin(c, self.selector), call
                )
        else:
            _pipes.close_stdin(call, self.selector)
        self._started(call)
        # The host calls back to back: build the next call's namespaces now, while this one
        # runs, or the next would wait for them. Otherwise wait for this call's answer
        # (see ``_maybe_finish``), so the forks do not compete with the call for the CPUs.
        now = time.monotonic()
        if now - self.last_answer < _BACK_TO_BACK:
            self._refill_spare()

    def _may_run(self, call_id: int, order: RunOrder, plan: _launch.LaunchPlan) -> bool:
        """Whether the request may start now; if not, answer it with why."""
        if call_id in self.calls:
            self.fail(call_id, f"call id {call_id} is already running")
            return False
        if not order.detach:
            return True  # only a detached process is bounded per turn
        detached = sum(1 for c in self.calls.values() if c.detach)
        why = refusal(order, plan.confine and plan.pid_namespace, detached)
        if why is None:
            return True
        self.send({"type": "exit", "id": call_id, "refused": why})
        return False

    def _started(self, call: Call) -> None:
        """A detached process runs: the host's ``start`` returns now (its command's exit
        comes as ``exit`` later), and the spare it took is rebuilt a moment after."""
        if not call.detach:
            return
        self.send({"type": "started", "id": call.id})
        if self._source().spare is None and self.refill_at is None:
            self.refill_at = time.monotonic() + _REFILL_DELAY

    def _announce_exit(self, call: Call) -> None:
        """A detached call's command exited (init's ``X``): tell the host; its namespace
        (and whatever the command left running there) lives on."""
        statuses = status_values(call.spawned.status_text, "X")
        if call.exit_sent or not statuses or not statuses[0].isdigit():
            return
        call.exit_sent = True
        # All the command wrote is in its log pipe before init reports its exit, but the
        # selector may serve the status pipe first: send the log before the exit, or the
        # host's result() misses its tail. One pump reads up to 1 MiB, what a pipe holds
        # by default; a daemon left writing cannot keep the server here.
        self._pump(call, "stdout")
        # The command ended by itself, now, whatever happens to its namespace later.
        code = _launch.exit_code_of(int(statuses[0]))
        duration = time.monotonic() - call.started
        self.send(exit_frame(call, code, timed_out=False, cancelled=False, duration=duration))

    def _watch(self, fd: int, events: int, handler: Callable[[Call], None], call: Call) -> None:
        """Watch one of ``call``'s pipes, bound to that call and no other.

        A pipe's number is free for the next pipe once closed, while its call may
        still be running (a command that closed its stdout): finding the call by
        number would hand a later call's output to it.
        """
        self.selector.register(fd, events, lambda _fd, _events: handler(call))

    def _pump(self, call: Call, stream: str) -> None:
        if _pipes.pump(call, stream, self.send, self.selector):
            self._maybe_finish(call)

    def _on_wake(self, fd: int, events: int) -> None:
        try:
            while os.read(fd, 4096):
                pass
        except BlockingIOError:
            pass
        for call in list(self.calls.values()):
            if call.status is not None or not call.spawned.group:
                continue  # a namespace call ends on its status pipe
            try:
                pid, status = os.waitpid(call.spawned.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = call.spawned.pid, 0
            if pid == 0:
                continue
            self._ended(call, status)
        if self.spawner is not None:
            self.spawner.reap()
        self.files.reap()
        if self.relay is not None and _launch.has_exited(self.relay):
            self.relay = None  # reaped; calls then see the proxy port refuse connections

    def _ended(self, call: Call, status: int) -> None:
        """The call's processes are gone (``status`` is its reaped child's): drain and finish."""
        call.status = status
        call.duration = time.monotonic() - call.started
        if call.spawned.group:
            _killpg(call.spawned.pid)
        _pipes.close_stdin(call, self.selector)
        call.drain_deadline = time.monotonic() + (
            _DRAIN_GROUP if call.spawned.group else _DRAIN_NAMESPACE
        )
        for stream in _pipes.PIPES:
            self._pump(call, stream)
        self._maybe_finish(call)

    def _mark_bounds(self, call: Call) -> None:
        """What the turn's bounds stand at as ``call`` starts, for its answer to compare."""
        if self.oom_fd is not None:
            call.oom_mark = _bounds.oom_kills(self.oom_fd)
        if self.disk_path is not None:
            call.disk_full_before = _bounds.disk_full(self.disk_path) is not None

    def _on_status(self, call: Call) -> None:
        if self.calls.get(call.id) is not call:
            return  # answered, and its status pipe closed, earlier in this round
        if self._drain_status(call) and call.status is None:
            # The chain is gone altogether, without a ``D``.
            self._stop_watching_status(call)
            self._ended(call, 0)

    def _stop_watching_status(self, call: Call) -> None:
        with suppress(KeyError, ValueError):
            self.selector.unregister(call.spawned.status)

    def _drain_status(self, call: Call) -> bool:
        """Read what the status pipe holds; return True once it is closed.

        Whoever reads it, for any purpose, acts on what it says here: a ``D`` (init, or
        the zygote having reaped init, says the namespace is empty) ends the call, which
        may answer it and close this pipe; a detached command's ``X`` without it is
        announced to the host. A ``D`` read elsewhere and acted on later (the memory
        watch reads ``P`` here) left the call holding its detached slot after the host
        had its exit, until the pipe's end: the next ``start`` was refused.
        """
        if call.spawned.status < 0:
            return True  # answered: its pipe is closed
        closed = False
        try:
            while True:
                data = os.read(call.spawned.status, 4096)
                if not data:
                    closed = True
                    break
                call.spawned.status_text += data
        except BlockingIOError:
            pass
        call.namespace_empty = b"D\n" in call.spawned.status_text.splitlines(keepends=True)
        if call.namespace_empty:
            # A detached command's exit then goes with the answer, sent once the call no
            # longer holds a slot. At shutdown nobody is answered: the caller kills the rest.
            if call.status is None and not call.spawned.group and self.running:
                self._stop_watching_status(call)
                self._ended(call, 0)
        elif call.detach and not call.exit_sent and b"X" in call.spawned.status_text:
            self._announce_exit(call)
        return closed

    def _still_running(self, call: Call) -> bool:
        """Whether ``call`` still runs, once what its status pipe holds is read: a stop (a
        kill, a timeout) must not take a call that ended by itself for one it stopped."""
        self._drain_status(call)
        return call.status is None

    def _read_status(self, call: Call, letter: str) -> list[str]:
        """What the status pipe has said so far in its lines marked ``letter``."""
        self._drain_status(call)
        return status_values(call.spawned.status_text, letter)

    def _kill(self, call: Call) -> None:
        """SIGKILL the call: its pid 1 (the kernel then empties the namespace) or its group."""
        if call.spawned.group:
            _killpg(call.spawned.pid)
            return
        if not self._still_running(call):
            return  # the namespace is empty and its pid 1 reaped: that pid may name another
        init = status_values(call.spawned.status_text, "P")
        if not init:
            # The zygote names init as soon as it has forked it; wait the moment that takes.
            _wait_readable(call.spawned.status, 1.0)
            if not self._still_running(call):
                return  # its ``D`` came instead: it ended (and may be answered)
            init = status_values(call.spawned.status_text, "P")
        if init and init[0].isdigit():
            self._source().kill_init(int(init[0]))

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for call in list(self.calls.values()):
            if call.drain_deadline is not None:
                if now >= call.drain_deadline:
                    for stream in _pipes.PIPES:
                        _pipes.close(call, stream, self.selector)
                    self._maybe_finish(call)
            elif now >= call.deadline and not call.timed_out and self._still_running(call):
                call.timed_out = True
                self._kill(call)
        self.files.check(now)

    def _watch_memory(self) -> None:
        """Every ``MEMORY_INTERVAL`` while calls run, stop the largest call past the turn's memory.

        The limit is the turn's: every running call's processes together
        (``_bounds.call_memory``). RLIMIT_AS bounds each process between samples.
        """
        plan = self.plan
        zygote = None if self.spawner is None else self.spawner.zygote
        running = [c for c in self.calls.values() if c.status is None and c.memory_stopped is None]
        if not running or plan is None or zygote is None or not plan.confine:
            self.memory_at = None
            return
        now = time.monotonic()
        if self.memory_at is None:
            self.memory_at = now + _bounds.MEMORY_INTERVAL
        if now < self.memory_at:
            return
        inits: dict[int, int] = {}
        tasks: dict[int, int] = {}
        for call in running:
            init = self._read_status(call, "P")
            if call.status is not None:
                continue  # the read found its ``D``: it ended, and may be answered
            if init and init[0].isdigit():
                inits[int(init[0])] = call.id
        config, _ = self._configured()
        limits = config.limits
        stop = _bounds.victim(inits, zygote.call_depth, limits["memory_mb"] << 20, tasks)
        for call_id, reached in _bounds.processes_reached(tasks, limits["processes"]).items():
            # The first sight stands: the kernel refused the call's forks from then on.
            if self.calls[call_id].processes_reached is None:
                self.calls[call_id].processes_reached = reached
        # A sample takes at most a tenth of the server's time, however many processes.
        spent = time.monotonic() - now
        self.memory_at = now + max(_bounds.MEMORY_INTERVAL, _bounds.MEMORY_BACKOFF * spent)
        if stop is not None:
            call = self.calls[stop[0]]
            call.memory_stopped = stop[1]
            self._kill(call)

    def _maybe_finish(self, call: Call) -> None:
        if (
            call.status is None
            or call.output_open
            or call.errors_open
            or self.calls.get(call.id) is not call
        ):
            return
        del self.calls[call.id]
        self._answer(call, call.status)
        self.last_answer = time.monotonic()
        if self._source().spare is None and self.refill_at is None:
            # Let the host take the answer first; the next spare's forks come a moment later.
            self.refill_at = self.last_answer + _REFILL_DELAY

    def _answer(self, call: Call, status: int) -> None:
        """Send a finished call's exit frame (or its error) and its outbox files.

        ``status`` is the wait status of the call's reaped child (a group call's).
        """
        self._drain_status(call)
        self._stop_watching_status(call)
        os.close(call.spawned.status)
        # Its number may name another call's pipe from now: nothing reads it again.
        call.spawned.status = -1
        if self.oom_fd is not None and call.oom_mark is not None:
            # The kernel's OOM killer took processes of the turn while this call ran: those
            # were this call's (init makes calls its first choice), or it would not have ended.
            kills = _bounds.oom_kills(self.oom_fd)
            if kills is not None and kills > call.oom_mark:
                call.oom_killed = kills - call.oom_mark
                if self.limit_fd is not None:
                    call.oom_limit = _bounds.group_limit(self.limit_fd)
        if self.disk_path is not None and not call.disk_full_before:
            call.disk_full = _bounds.disk_full(self.disk_path)
        error, exit_code = outcome(call, status)
        if error is not None:
            self._drop_outbox(call.id)
            self.fail(call.id, error)
            return
        if call.kind != "call":
            # An exec returns its streams and a detached process its log, not outbox files:
            # what it left there goes. A detached command's exit went out when it came,
            # unless it never exited by itself (killed: with the turn, by the host, the watch).
            self._drop_outbox(call.id)
            if not call.exit_sent:
                call.exit_sent = True
                self.send(exit_frame(call, exit_code))
            return
        config, _ = self._configured()
        collected = _outbox.collect(
            self.outbox,
            call.id,
            config.drop_uid,
            config.limits["disk_mb"] << 20,
        )
        try:
            files = [{"name": name, "size": size} for name, _, size in collected.files]
            skipped = sorted(collected.skipped.items())
            unlisted = collected.unlisted
            self.send(exit_frame(call, exit_code, files=files, skipped=skipped, unlisted=unlisted))
        except BaseException:
            collected.close()
            raise
        _outbox.send_files(self.send, call.id, collected.files)

    def _drop_outbox(self, call_id: int) -> None:
        """Remove the outbox of a call that produced no answer."""
        _outbox.collect(self.outbox, call_id, None, 0).close()

    # -- shutdown ----------------------------------------------------------------

    def _stop_everything(self) -> None:
        if self.spawner is not None:
            self.spawner.close_spare()
        for call in list(self.calls.values()):
            self._kill(call)
        for call in self.calls.values():
            if call.spawned.group:
                with suppress(ChildProcessError):
                    os.waitpid(call.spawned.pid, 0)
        if self.spawner is not None:
            self.spawner.close()
        self.files.stop()
        if self.relay is not None:
            with suppress(OSError):
                os.kill(self.relay, signal.SIGKILL)


def _wait_readable(fd: int, timeout: float) -> None:
    """Block until ``fd`` has something to read (or end of file), at most ``timeout`` seconds."""
    with Selector() as selector:
        selector.register(fd, EVENT_READ)
        selector.select(timeout)


def _passing(passed: bool, answer: dict[str, Any]) -> dict[str, Any]:
    """A freeze's ``answer``, its descriptor passed with it where the host asked (``send``)."""
    if passed and "error" not in answer and isinstance(answer.get("fd"), int):
        return dict(answer, pass_fd=answer["fd"])
    return answer


def _killpg(pgid: int) -> None:
    with suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def main() -> None:
    """Serve the host on this process's stdin and stdout."""
    # Not dumpable: a process of its uid that holds no capability over it (a call beside it,
    # where calls get no namespaces of their own) may neither ptrace it nor open its /proc.
    # Its forks inherit it: each call's init and the helpers until they change their ids.
    _sys.prctl(_sys.PR_SET_DUMPABLE, 0)
    rfd = os.dup(0)
    wfd = os.dup(1)
    # Nothing but frames may reach the host's pipe: stray prints go to stderr, reads see nothing.
    os.dup2(2, 1)
    null_r, null_w = os.pipe()
    os.dup2(null_r, 0)
    os.close(null_r)
    os.close(null_w)
    Server(rfd, wfd).serve()


#: How the server answers each request, by message type (``shutdown`` ends the loop).
_REQUESTS: dict[str, Callable[[Server, Any, Any, bytes], None]] = {
    "hello": Server._hello,
    "run": Server._run,
    "fs": Server._file_op,
    "snapshot": Server._file_op,
    "restore": Server._file_op,
    "freeze": Server._freeze,
    "adopt": Server._adopt,
    "cancel": Server._cancel,
}
