"""The host side of the sandbox server: how to start it, and a session that speaks to it.

Every built-in backend starts the same server inside its sandbox with
``server_command(python)`` and writes ``server_payload()`` to its stdin first:
the server's modules travel as source, so nothing has to be mounted and any
Python 3.8+ in the sandbox will do. ``ServerSession`` then says ``hello``, waits
for ``ready`` and multiplexes calls over the pipe; one reader thread hands each
frame to the call waiting for it. See ``docs/sandbox-server.md``.

The module is longer than most because the session is one state machine
(calls in flight, the reader thread, the spare's timing, close) over one pipe;
the pieces that stand alone already live apart (channels in ``_channels``, the
wire format in ``server/_protocol``, the thread sandboxes start from in
``_lifeline``).
"""

from __future__ import annotations
import __future__

import base64
import collections
import concurrent.futures
import contextlib
import functools
import marshal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from types import CodeType, TracebackType
from typing import IO, Any

import attrs

from .._aio import cancelled_exception, wait_future
from ..errors import BackendUnavailableError, PromiseNotEnforcedError, SandboxError, UsageError
from ._api import (
    Channel,
    DetachedProcess,
    DetachRequest,
    ExecRequest,
    ExecResult,
    FsReply,
    FsRequest,
    OutboxFile,
    RunOutcome,
    RunRequest,
    SandboxSession,
)
from ._cgroup import turn_memory_bytes
from ._memory_notes import limit_met, memory_notes, with_notes
from ._outbox_notes import skipped_note, unlisted_note
from ._owner import Owner
from ._policy import (
    EGRESS_DIR,
    EGRESS_PORT,
    EGRESS_SOCKET_NAME,
    OUTBOX_DIR,
    ROOT_DIRS,
    SYSTEM_DIRS,
    WORKSPACE_DIR,
    WORKSPACE_LOWER_DIR,
    Policy,
    Promise,
)
from ._temporary_outbox import TurnOutbox
from .server import _protocol

__all__ = [
    "ServerBuild",
    "ServerSession",
    "compile_command",
    "parse_build",
    "server_command",
    "server_payload",
]

#: The server's modules, in the order they are executed (each may import those before it).
#: ``_seccomp`` and ``_files`` are optional: the server reports what it lacks.
SERVER_MODULES = (
    "_lean",
    "_protocol",
    "_sys",
    "_seccomp",
    "_userns",
    "_launch",
    "_init",
    "_probe",
    "_rootfs",
    "_lowerfs",
    "_kernelmem",
    "_bounds",
    "_zygote",
    "_paths",
    "_viewtext",
    "_readview",
    "_globview",
    "_listview",
    "_files",
    "_snapfiles",
    "_fsops",
    "_outbox",
    "_worker",
    "_relay",
    "_calls",
    "_pipes",
    "_fsqueue",
    "_hello",
    "_spawner",
    "_main",
)
_PACKAGE = "_astralvessel_server"
#: The payload's marshal format: 4 is what Python 3.4 and every later version read.
_PAYLOAD_MARSHAL = 4

# Reads exactly argv[1] bytes of the payload with os.readv into one buffer of that size (a
# buffered read could swallow the frames behind it; appending each read to the bytes read
# so far copies them again every time: 3.9 ms of the server's CPU for 0.6 MB, 0.9 this
# way), makes each module in a private package, runs main. The payload is
# a marshal of plain values (format 4, which every Python 3.4+ reads: json would cost the
# start-up its import of re and enum). It carries each module twice: as source, and
# compiled by the host's interpreter (a marshal of code objects). A server on the very same
# interpreter build (bubblewrap and nsjail run the host's own) loads the compiled code in
# about a millisecond, where compiling 130 kB of source is most of a cold turn start; any
# other Python (a Docker image's) compiles the source. Both compile with optimize=2: the
# server has no assert and never reads a docstring; without them the compiled code is 56 kB
# smaller (an idle turn's PSS, measured A/B, moved by less than 0.05 MiB).
# Before main, the payload is dropped and what is loaded frozen out of the collector's reach:
# the server forks its helpers, and a collection in them would copy the pages they share.
# A third argument is a seccomp program in hex that the bootstrap installs (with
# no_new_privs) before it reads anything: nsjail's server takes its x32 refusal so (see
# ``x32_guard``), and a failure ends the server before any of its code runs.
# When main returns (its calls and helpers are gone), the process leaves with os._exit:
# tearing down the interpreter's modules takes milliseconds of every turn's close for
# nothing, since no Python code of the server has anything left to do.
BOOTSTRAP = f"""\
import os,sys,marshal,types
if sys.argv[2:]:
 import ctypes as C,struct;f=bytes.fromhex(sys.argv[2]);g=C.create_string_buffer(f,len(f))
 l=C.CDLL(None,use_errno=True);u=C.c_ulong;p=struct.pack('HP',len(f)//8,C.addressof(g))
 if l.prctl(38,u(1),u(0),u(0),u(0)) or l.prctl(22,u(2),p,u(0),u(0)):
  sys.exit('astralvessel server: cannot install its filter: '+os.strerror(C.get_errno()))
 del C,struct,f,g,l,u,p
n=int(sys.argv[1]);b=bytearray(n);v=memoryview(b);i=0
while i<n:
 c=os.readv(0,[v[i:]])
 if not c:sys.exit('astralvessel server: payload cut short')
 i+=c
d=marshal.loads(b);c=None;v.release()
if d['tag']==[sys.hexversion,sys.implementation.cache_tag]:c=marshal.loads(d['code'])
P={_PACKAGE!r};p=types.ModuleType(P);p.__path__=[];sys.modules[P]=p
for k,v in d['src'].items():
 m=types.ModuleType(P+'.'+k);m.__package__=P;sys.modules[m.__name__]=m;setattr(p,k,m)
 try:exec(c[k] if c else compile(v,P+'/'+k+'.py','exec',optimize=2),m.__dict__)
 except ImportError:del sys.modules[m.__name__];delattr(p,k)
del b,c,d,i,k,v,m
import gc;gc.freeze()
p._main.main()
sys.stdout.flush();sys.stderr.flush();os._exit(0)
"""

# How long past a call's own timeout the host waits before declaring the server stuck
# (covers killing the call and sending its outbox files).
_ANSWER_GRACE = 60.0

#: Seconds the sandbox's file worker may sit idle before the server retires it: it holds
#: the file tools' imports (about 4 MiB of a turn's memory), which a turn waiting on its
#: model keeps for nothing. The next file request starts a fresh one (a few ms).
FILE_WORKER_IDLE = 30.0

#: The most outbox files (and bytes) one turn writes to the host; the server bounds each
#: call (100 files, the disk limit), the host bounds the turn, whatever the server says.
OUTBOX_FILES_PER_TURN = 1000
OUTBOX_BYTES_PER_TURN = 1 << 30
#: The most outbox files one ``exit`` frame may announce (the server's own bound).
_OUTBOX_FILES_PER_CALL = 100
#: The file requests that travel as a message of their own (``_snapfiles`` in the server).
_FS_MESSAGES = {"pack": "snapshot", "unpack": "restore"}


@functools.cache
def _sources() -> tuple[tuple[str, str], ...]:
    """Each server module's name and source, in ``SERVER_MODULES`` order."""
    package = resources.files("astralvessel.sandbox.server")
    found = []
    for name in SERVER_MODULES:
        source = package / f"{name}.py"
        if source.is_file():
            found.append((name, source.read_text(encoding="utf-8")))
    return tuple(found)


@functools.cache
def server_payload(build: ServerBuild | None = None) -> bytes:
    """Return the bytes to write to the server's stdin before anything else: its own code.

    The code is compiled by this interpreter, or taken from ``build`` (the
    modules compiled by the sandbox's own Python, see ``compile_command``).
    """
    sources = dict(_sources())
    if build is None:
        build = ServerBuild(
            hexversion=sys.hexversion,
            cache_tag=sys.implementation.cache_tag,
            code=marshal.dumps(_compiled(sources)),
        )
    else:
        # The sandbox's own Python compiled this code, so its tag matches and the sources,
        # the fallback for an interpreter that differs, are never read: send their names
        # only (on Docker the payload crosses the engine, 40% less of it per turn start).
        sources = dict.fromkeys(sources, "")
    payload = {"tag": [build.hexversion, build.cache_tag], "code": build.code, "src": sources}
    return marshal.dumps(payload, _PAYLOAD_MARSHAL)


@attrs.frozen
class ServerBuild:
    """The server's modules compiled by one interpreter: its ``sys.hexversion``, its
    ``sys.implementation.cache_tag``, and a marshal of each module's code object."""

    hexversion: int = attrs.field(validator=attrs.validators.instance_of(int))
    cache_tag: str = attrs.field(validator=attrs.validators.instance_of(str))
    code: bytes = attrs.field(validator=attrs.validators.instance_of(bytes), repr=False)


# Compiles the modules given as name, source, name, source... exactly as the host's
# ``_compiled`` does, and prints the interpreter's tag and the code (marshal, base64). The
# sources are checked to parse as Python 3.8, so the interpreter is refused before that.
_COMPILE = f"""\
import sys,marshal,binascii,__future__
if sys.version_info<(3,8):sys.exit(3)
a=sys.argv[1:];c={{}};f=__future__.annotations.compiler_flag
for i in range(0,len(a),2):
 c[a[i]]=compile(a[i+1],{_PACKAGE!r}+'/'+a[i]+'.py','exec',f,True,2)
t=sys.implementation.cache_tag
sys.stdout.write('%d %s\\n'%(sys.hexversion,t)+binascii.b2a_base64(marshal.dumps(c)).decode())
"""


def compile_command(python: str) -> list[str]:
    """The argv that has ``python`` (in a sandbox) compile the server's modules.

    What it prints is read with ``parse_build``. It exits with status 3 on a
    Python older than 3.8, which cannot run the server. The sources travel as
    arguments, each well under the kernel's 128 KiB a string.
    """
    argv = [python, "-I", "-S", "-B", "-c", _COMPILE]
    for name, source in _sources():
        argv += [name, _without_future_import(source)]
    return argv


def parse_build(output: bytes) -> ServerBuild | None:
    """What ``compile_command`` printed, or None if it is not that (the turn then compiles)."""
    head, _, body = output.partition(b"\n")
    fields = head.decode("ascii", "replace").split()
    if len(fields) != 2 or not fields[0].isdigit():
        return None
    try:
        code = base64.b64decode(body.strip(), validate=True)
    except ValueError:
        return None
    return ServerBuild(hexversion=int(fields[0]), cache_tag=fields[1], code=code) if code else None


#: Every server module's future statement (the idle tests check the server imports no
#: ``__future__``, so a module that spells it otherwise fails there).
_FUTURE_IMPORT = "from __future__ import annotations\n"


def _without_future_import(source: str) -> str:
    """``source`` with its future statement blanked (its lines keep their numbers).

    Compiled code keeps a future statement as a runtime import of ``__future__.py``
    (0.4 ms of every turn start): the compiled modules get the flag from ``compile``
    instead. The source sent as the fallback keeps its statement.
    """
    return source.replace(_FUTURE_IMPORT, "\n", 1)


def _compiled(sources: Mapping[str, str]) -> dict[str, CodeType]:
    """Each module's code as ``compile_command``'s would be, without this module's futures
    but postponed annotations (given as a flag, not imported: ``_without_future_import``)."""
    flags = __future__.annotations.compiler_flag
    return {
        name: compile(
            _without_future_import(text),
            f"{_PACKAGE}/{name}.py",
            "exec",
            flags=flags,
            dont_inherit=True,
            optimize=2,
        )
        for name, text in sources.items()
    }


def server_command(
    python: str, build: ServerBuild | None = None, *, first_filter: bytes | None = None
) -> list[str]:
    """Return the argv that starts the server on ``python`` (a path inside the sandbox).

    ``build``: the modules compiled by that Python, when it is not this one (the
    same must then reach ``ServerOptions.build``). ``first_filter``: a seccomp
    program the server installs, with ``no_new_privs``, before it reads its code.
    """
    argv = [python, "-I", "-S", "-B", "-c", BOOTSTRAP, str(len(server_payload(build)))]
    return argv if first_filter is None else [*argv, first_filter.hex()]


# Which promises a failed confinement step breaks (keys are the server's probe steps).
_PROBLEM_PROMISES: dict[str, tuple[Promise, ...]] = {
    "pid_namespace": (Promise.PROCESS_ISOLATION, Promise.NO_NEW_SESSIONS),
    "unprivileged": (Promise.UNPRIVILEGED,),
    "user_namespace": (Promise.PROCESS_LIMIT,),
    "no_new_privs": (Promise.UNPRIVILEGED,),
    "seccomp": (Promise.SECCOMP,),
    "workspace_inodes": (Promise.DISK_LIMIT,),
    "rlimits": (
        Promise.OPEN_FILES_LIMIT,
        Promise.DISK_LIMIT,
        Promise.MEMORY_LIMIT,
        Promise.PROCESS_LIMIT,
    ),
}


#: The server's confinement probe results, by what they depend on (``_probe_key``): the
#: probe forks a chain of namespaces (about 10 ms of a 60 ms turn start), and its answer
#: is the same for every turn started the same way on this host. Bounded: a host that
#: starts turns in many ways probes again past this many.
_PROBED: dict[str, dict[str, str]] = {}
_PROBED_MOST = 64


#: Hello fields that name this turn's own places, not how its calls are confined.
_TURN_PLACES = frozenset(
    (
        "env",
        "workdir",
        "workspace",
        "outbox",
        "visible_roots",
        "path_map",
        "egress",
        "probed",
        "memory_events",
        "memory_limits",
    )
)


def _probe_key(key: str | None, confine: bool, hello: Mapping[str, Any]) -> str | None:
    """What a probe's result depends on; ``None`` when it is not to be reused.

    Every hello field but the turn's places counts (a field added later counts
    too, unless listed), except that only whether calls drop to a uid matters,
    not which one: every uid a turn gets maps alike.
    """
    if key is None or not confine:
        return None
    settings = {k: v for k, v in hello.items() if k not in _TURN_PLACES}
    settings["drop_uid"] = hello["drop_uid"] is None
    settings["drop_gid"] = hello["drop_gid"] is None
    return key + "\0" + _json_text(settings)


def _json_text(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def unenforced_promises(problems: Mapping[str, str]) -> dict[Promise, str]:
    """Map the server's failed probe steps to the promises they break, each with why."""
    broken: dict[Promise, str] = {}
    for step, why in problems.items():
        for promise in _PROBLEM_PROMISES.get(step, ()):
            broken.setdefault(promise, f"{step}: {why}")
    return broken


class _Pending:
    """A request the host is waiting on; the reader thread fills it in."""

    def __init__(
        self, kind: str, output_chars: int = 0, outbox: Path | None = None, output_bytes: int = 0
    ) -> None:
        self.kind = kind
        #: An exec's streams, each bounded to ``output_bytes`` again on the host.
        self.output_bytes = output_bytes
        self.streams = {"stdout": bytearray(), "stderr": bytearray()}
        self.stream_cut = False
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        #: A detached process: settled when the server says it runs (or refused it).
        self.started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.output_chars = output_chars
        self.max_bytes = output_chars * 4
        self.output = bytearray()
        self.kept_chars = 0
        self.dropped_chars = 0
        self.cut = False
        self.outbox = outbox
        self.exit: dict[str, Any] | None = None
        self.files: list[OutboxFile] = []
        #: Announced outbox files still to come: name, size, and whether the host keeps it.
        self.expected: collections.deque[tuple[str, int, bool]] = collections.deque()
        self.current: IO[bytes] | None = None
        self.current_written = 0
        #: Outbox entries not returned, by reason (the server's and the turn's budget).
        self.skipped: dict[str, int] = {}

    def add_output(self, chunk: bytes) -> None:
        # The server already bounds what it streams; the host bounds it again, by characters
        # and by bytes (invalid UTF-8 can pack many bytes into one counted character).
        if not self.cut:
            index = _protocol.split_chars(chunk, self.output_chars - self.kept_chars)
            index = min(index, self.max_bytes - len(self.output))
            keep = chunk[:index]
            self.output += keep
            self.kept_chars += _protocol.count_chars(keep)
            if index == len(chunk):
                return
            self.cut = True
            chunk = chunk[index:]
        self.dropped_chars += _protocol.count_chars(chunk)

    def add_stream(self, stream: str, chunk: bytes) -> None:
        """An exec's output chunk: ``output_bytes`` kept per stream, whatever the server says."""
        kept = self.streams[stream]
        room = max(0, self.output_bytes - len(kept))
        kept += chunk[:room]
        if len(chunk) > room:
            self.stream_cut = True


def _fs_reply(header: Mapping[str, Any], body: bytes) -> FsReply:
    """The worker's answer to a file primitive: its fields, the bytes read, or the refusal."""
    error = header.get("error")
    fields = {k: v for k, v in header.items() if k not in ("type", "id", "error")}
    if not isinstance(error, dict):
        return FsReply(fields=fields, data=body)
    return FsReply(
        fields=fields, errno=str(error.get("errno")), message=str(error.get("message", ""))[:2000]
    )


def _server_failed(header: Mapping[str, Any], body: bytes) -> SandboxError:
    return SandboxError(f"the sandbox server failed a call: {header.get('message')}")


#: Frames that answer a request in one piece, by type: each builds the answer (or the error).
_ANSWERS: Mapping[str, Callable[[Mapping[str, Any], bytes], object]] = {
    "error": _server_failed,
    "fs_result": _fs_reply,
}


def _outbox_of(item: _Pending) -> Path:
    if item.outbox is None:
        raise _protocol.ProtocolError("outbox files for a request that is not a run")
    return item.outbox


class ServerSession(SandboxSession):
    """A turn's sandbox reached through its server; every backend's session is one of these."""

    def __init__(
        self, channel: Channel, policy: Policy, *, backend: str, outbox_dir: Path | None
    ) -> None:
        self.policy = policy
        self.backend = backend
        self.ready_info: Mapping[str, Any] = {}
        #: The most output bytes the host held for any one call (the bound is ``output_chars * 4``).
        self.max_buffered_output = 0
        self._channel = channel
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next_id = 1
        self._dead: str | None = None
        self._closed = False
        #: The process that started the sandbox: a forked child never uses or ends it.
        self._owner = Owner()
        self._ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        # Without a host folder (here or on the policy), outbox files go to a temporary folder
        # that outlives ``close`` while a result names a file in it.
        self._turn_outbox = TurnOutbox(
            outbox_dir if outbox_dir is not None else policy.outbox_dir, f"{self.backend}-outbox"
        )
        self._outbox_files = 0
        self._outbox_bytes = 0
        self._reader = threading.Thread(
            target=self._read_loop, name=f"{backend}-server-reader", daemon=True
        )

    @classmethod
    def start(
        cls,
        channel: Channel,
        policy: Policy,
        *,
        backend: str,
        confine: bool,
        drop_uid: int | None,
        drop_gid: int | None,
        seccomp: bytes | None,
        helper_seccomp: Mapping[str, bytes] | None = None,
        path_map: Mapping[str, str] | None = None,
        outbox_dir: Path | None = None,
        ready_timeout: float = 30.0,
        probe_key: str | None = None,
        build: ServerBuild | None = None,
        memory_events: Sequence[str] = (),
        memory_limits: Sequence[str] = (),
    ) -> ServerSession:
        """Boot the server on ``channel`` (payload, then ``hello``) and wait for ``ready``.

        Raises ``SandboxError`` if the server does not come up (with its stderr
        tail), and ``PromiseNotEnforcedError`` if it cannot confine calls as
        asked and ``policy.relaxed`` does not allow that. Closes the channel on
        any failure. ``outbox_dir`` keeps outbox files after ``close``; without
        it they go to a temporary folder removed at ``close``, or later, when the
        last ``OutboxFile`` naming a file in it is collected. ``probe_key``
        lets turns started alike share one confinement probe, and ``build`` is
        the code the server's own Python compiled (both: ``ServerOptions``).
        """
        session = cls(channel, policy, backend=backend, outbox_dir=outbox_dir)
        hello = {
            "type": "hello",
            "confine": confine,
            "drop_uid": drop_uid,
            "drop_gid": drop_gid,
            "seccomp": None if seccomp is None else base64.b64encode(seccomp).decode("ascii"),
            "helper_seccomp": {
                name: base64.b64encode(program).decode("ascii")
                for name, program in (helper_seccomp or {}).items()
            },
            "env": dict(policy.environment),
            "workdir": str(policy.workdir),
            "workspace": str(WORKSPACE_DIR),
            "outbox": str(OUTBOX_DIR),
            "limits": {
                "disk_mb": policy.limits.disk_mb,
                "memory_mb": policy.limits.memory_mb,
                "processes": policy.limits.processes,
                "open_files": policy.limits.open_files,
                "workspace_inodes": policy.limits.workspace_inodes,
            },
            "visible_roots": [str(root) for root in policy.visible_roots],
            "writable_roots": [str(root) for root in policy.writable_roots],
            "path_map": dict(path_map or {}),
            "egress": (
                None
                if policy.egress_socket is None
                else {"socket": str(EGRESS_DIR / EGRESS_SOCKET_NAME), "port": EGRESS_PORT}
            ),
            # The root directories to make writable (none: a read-only root).
            "writable_root": [str(d) for d in (*SYSTEM_DIRS, *ROOT_DIRS)]
            if policy.writable_root
            else [],
            "root_identity": policy.root_identity,
            "tool_servers": policy.tool_servers,
            # The snapshot's tree the workspace's overlay lies on (None: an empty workspace).
            "workspace_lower": None if policy.workspace_lower is None else str(WORKSPACE_LOWER_DIR),
            "file_worker_idle": FILE_WORKER_IDLE,
            "memory_events": list(memory_events),
            "memory_limits": list(memory_limits),
        }
        key = _probe_key(probe_key, confine, hello)
        known = None if key is None else _PROBED.get(key)
        hello["probed"] = known
        try:
            session._reader.start()
            session._send(server_payload(build) + _protocol.encode(hello))
            try:
                info = session._ready.result(timeout=ready_timeout)
            except concurrent.futures.TimeoutError:
                raise SandboxError(
                    f"the {backend} sandbox server did not become ready "
                    f"within {ready_timeout:g} s; "
                    f"{channel.describe_exit()}"
                ) from None
            if key is not None and known is None and isinstance(info.get("probed"), dict):
                if len(_PROBED) >= _PROBED_MOST:
                    _PROBED.clear()
                _PROBED[key] = {str(k): str(v) for k, v in info["probed"].items()}
            session._check_ready(info, confine=confine, seccomp=seccomp)
        except BaseException:
            session.close()
            raise
        return session

    def _check_ready(
        self, info: Mapping[str, Any], *, confine: bool, seccomp: bytes | None
    ) -> None:
        if info.get("version") != _protocol.VERSION:
            raise SandboxError(
                f"the {self.backend} sandbox server speaks protocol {info.get('version')!r}, "
                f"this library {_protocol.VERSION}: reinstall astralvessel"
            )
        self.ready_info = info
        if self.policy.egress_socket is not None and info.get("egress") is not True:
            raise SandboxError(
                f"the {self.backend} sandbox server cannot relay calls to the egress proxy: "
                f"{info.get('egress') or 'it does not know how'}"
            )
        # The eval relaxations the host asked for: given, or the turn does not start.
        given = dict(info.get("relaxations") or {})
        asked = {
            "writable_root": self.policy.writable_root,
            "root_identity": self.policy.root_identity,
            "tool_servers": self.policy.tool_servers,
        }
        for name, wanted in asked.items():
            if wanted and isinstance(given.get(name), (str, type(None))):
                why = given.get(name) or "this server does not offer it"
                raise BackendUnavailableError(f"{self.backend} cannot give {name} here: {why}")
        if not confine:
            return
        problems = dict(info.get("problems") or {})
        if seccomp is not None and not info.get("seccomp"):
            problems.setdefault("seccomp", "the server cannot install a seccomp filter")
        for promise, why in unenforced_promises(problems).items():
            if promise not in self.policy.relaxed:
                raise PromiseNotEnforcedError(self.backend, promise.value, why)

    @property
    def channel(self) -> Channel:
        """The channel the backend opened to this turn's server (what it ran on, for tests)."""
        return self._channel

    def unenforced(self) -> Mapping[Promise, str]:
        """The promises the server reported it cannot keep here, each with why."""
        return unenforced_promises(dict(self.ready_info.get("problems") or {}))

    def alive(self) -> bool:
        """False once the session is closed or its server has gone (the reader saw it end),
        and in a forked child (``_owner``)."""
        if self._owner.forked():  # before the lock: a thread of the parent may have held it
            return False
        with self._lock:
            return not self._closed and self._dead is None

    # -- wire --------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            try:
                self._channel.send(data)
            except OSError as exc:
                raise SandboxError(
                    self._death(f"cannot write to the sandbox server ({exc})")
                ) from None

    def _death(self, what: str) -> str:
        return f"{what}; {self._channel.describe_exit()}"

    def _read_loop(self) -> None:
        decoder = _protocol.FrameDecoder()
        reason = "the sandbox server closed its output"
        try:
            while True:
                data = self._channel.recv(65536)
                if not data:
                    if decoder.buffered:
                        # A frame cut short: whatever it was, the call it served has no end.
                        reason = (
                            "the sandbox server's output ended inside a frame "
                            f"({decoder.buffered} bytes of it came)"
                        )
                    break
                decoder.feed(data)
                while (frame := decoder.next()) is not None:
                    self._on_frame(*frame)
        except _protocol.ProtocolError as exc:
            reason = f"the sandbox server broke protocol ({exc})"
            self._channel.close()
        except OSError as exc:
            reason = f"cannot read from the sandbox server ({exc})"
        except Exception as exc:
            reason = f"the sandbox session failed ({type(exc).__name__}: {exc})"
            self._channel.close()
        self._fail_all(reason if self._closed else self._death(reason))

    def _fail_all(self, message: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = message
            pending = list(self._pending.values())
            self._pending.clear()
        error = SandboxError(self._dead)
        if not self._ready.done():
            self._ready.set_exception(error)
        for item in pending:
            self._settle(item, exception=error)

    @staticmethod
    def _settle(
        item: _Pending, *, result: object = None, exception: BaseException | None = None
    ) -> None:
        if item.current is not None:
            item.current.close()
            item.current = None
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if exception is not None:
                item.future.set_exception(exception)
            else:
                item.future.set_result(result)
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if exception is not None:
                item.started.set_exception(exception)
            else:
                item.started.set_result(None)

    def _on_frame(self, header: dict[str, Any], body: bytes) -> None:
        kind = header["type"]
        if kind == "ready":
            if not self._ready.done():
                self._ready.set_result(header)
            return
        raw_id = header.get("id")
        if kind == "error" and raw_id is None:
            raise _protocol.ProtocolError(f"the server gave up: {header.get('message')}")
        call_id = raw_id if isinstance(raw_id, int) else -1
        with self._lock:
            item = self._pending.get(call_id)
        if item is None:
            return  # a call the host stopped waiting for (cancelled): drop what is left of it
        answer = _ANSWERS.get(kind)
        if answer is not None:
            outcome = answer(header, body)
            if isinstance(outcome, BaseException):
                self._finish(call_id, exception=outcome)
            else:
                self._finish(call_id, outcome)
            return
        self._on_stream(call_id, item, kind, header, body)

    def _on_stream(
        self, call_id: int, item: _Pending, kind: str, header: dict[str, Any], body: bytes
    ) -> None:
        """A frame of a running call or exec: output, its exit, or an outbox file's bytes."""
        if item.kind == "detach" and kind in ("started", "exit"):
            self._on_detached(call_id, item, kind, header)
        elif item.kind == "exec" and kind in ("out", "exit"):
            if kind == "out":
                item.add_stream("stderr" if header.get("stream") == "stderr" else "stdout", body)
            else:
                bound = turn_memory_bytes(self.policy.limits)
                self._finish(call_id, self._exec_result(item, header, bound))
        elif kind == "out":
            item.add_output(body)
            self.max_buffered_output = max(self.max_buffered_output, len(item.output))
        elif kind == "exit":
            self._on_exit(call_id, item, header)
        elif kind == "file":
            self._on_file_chunk(call_id, item, body)
        else:
            raise _protocol.ProtocolError(f"unexpected frame type {kind!r}")

    def _on_detached(
        self, call_id: int, item: _Pending, kind: str, header: Mapping[str, Any]
    ) -> None:
        """A detached process runs (``started``), was refused, or its command exited."""
        if kind == "started":
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                item.started.set_result(None)
            return
        refused = header.get("refused")
        if isinstance(refused, str):
            # Only the turn's bound or a server without namespaces refuses one.
            error_type = UsageError if "already holds" in refused else BackendUnavailableError
            self._finish(call_id, exception=error_type(refused[:2000]))
            return
        code = header.get("exit_code")
        # Killed (by its timeout, ``kill``, the memory watch): SIGKILL's code.
        if not isinstance(code, int) or header.get("timed_out"):
            code = -9
        self._finish(
            call_id,
            ExecResult(
                returncode=code,
                stdout=bytes(item.output),
                # Its log is stdout; what stopped it for memory is said apart, as an exec's.
                stderr=memory_notes(header, turn_memory_bytes(self.policy.limits)).encode(),
                timed_out=bool(header.get("timed_out")),
                truncated=item.cut or bool(header.get("dropped_chars")),
                duration=max(0.0, float(header.get("duration") or 0.0)),
                stopped_by_limit=limit_met(header),
            ),
        )

    def _finish(
        self, call_id: int, result: object = None, *, exception: BaseException | None = None
    ) -> None:
        with self._lock:
            item = self._pending.pop(call_id, None)
        if item is not None:
            self._settle(item, result=result, exception=exception)

    def _on_exit(self, call_id: int, item: _Pending, header: dict[str, Any]) -> None:
        item.exit = header
        entries = header.get("files") or ()
        if len(entries) > _OUTBOX_FILES_PER_CALL:
            raise _protocol.ProtocolError(f"{len(entries)} outbox files announced for one call")
        for reason, count in header.get("skipped") or ():
            if isinstance(reason, str) and isinstance(count, int):
                item.skipped[reason[:200]] = item.skipped.get(reason[:200], 0) + count
        for entry in entries:
            name, size = entry.get("name"), entry.get("size")
            if not isinstance(name, str) or name in {"", ".", ".."} or "/" in name or "\0" in name:
                raise _protocol.ProtocolError(f"outbox file name {name!r} is not a plain name")
            if not isinstance(size, int) or size < 0:
                raise _protocol.ProtocolError(f"outbox file size {size!r} is not a size")
            item.expected.append((name, size, self._budget_outbox(item, size)))
        self._next_file(call_id, item)

    def _budget_outbox(self, item: _Pending, size: int) -> bool:
        """Count one announced file against the turn's budget; False if it is not kept."""
        with self._lock:
            if self._outbox_files >= OUTBOX_FILES_PER_TURN:
                reason = f"past the turn's {OUTBOX_FILES_PER_TURN} outbox files"
            elif self._outbox_bytes + size > OUTBOX_BYTES_PER_TURN:
                reason = f"past the turn's {OUTBOX_BYTES_PER_TURN >> 20} MiB of outbox files"
            else:
                self._outbox_files += 1
                self._outbox_bytes += size
                return True
        item.skipped[reason] = item.skipped.get(reason, 0) + 1
        return False

    def _next_file(self, call_id: int, item: _Pending) -> None:
        """Open the next expected outbox file; resolve the call when none is left."""
        while item.expected:
            name, size, keep = item.expected[0]
            item.current_written = 0
            if keep:
                try:
                    outbox = _outbox_of(item)
                    outbox.mkdir(parents=True, exist_ok=True)
                    item.current = (outbox / name).open("wb")
                except OSError as exc:
                    # The host's disk, not the call: drop this file, keep the session.
                    self._host_write_failed(item, exc)
            if size:
                return
            self._file_done(item)
        self._finish(call_id, self._outcome(item, turn_memory_bytes(self.policy.limits)))

    @staticmethod
    def _host_write_failed(item: _Pending, exc: OSError) -> None:
        name, size, _ = item.expected[0]
        item.expected[0] = (name, size, False)
        if item.current is not None:
            with contextlib.suppress(OSError):
                item.current.close()
            item.current = None
            with contextlib.suppress(OSError):
                (_outbox_of(item) / name).unlink()
        reason = f"could not be written on the host ({exc.strerror or exc})"
        item.skipped[reason] = item.skipped.get(reason, 0) + 1

    def _file_done(self, item: _Pending) -> None:
        name, size, keep = item.expected.popleft()
        if item.current is not None:
            item.current.close()
            item.current = None
        if keep:
            file = OutboxFile(name=name, size=size, path=_outbox_of(item) / name)
            item.files.append(self._turn_outbox.adopt(file))

    def _on_file_chunk(self, call_id: int, item: _Pending, body: bytes) -> None:
        if not item.expected:
            raise _protocol.ProtocolError("outbox data for no announced file")
        name, size, _ = item.expected[0]
        if item.current_written + len(body) > size:
            raise _protocol.ProtocolError(f"outbox file {name!r} is longer than announced")
        if item.current is not None:
            try:
                item.current.write(body)
            except OSError as exc:
                self._host_write_failed(item, exc)
        item.current_written += len(body)
        if item.current_written == size:
            self._file_done(item)
            self._next_file(call_id, item)

    @staticmethod
    def _outcome(item: _Pending, bound: int) -> RunOutcome:
        """The call's result; ``bound`` (bytes) is the turn's memory group's as configured,
        for a note on the kernel's OOM killer that came without the limit it applied."""
        exit_info = item.exit or {}
        code = exit_info.get("exit_code")
        output = bytes(item.output).decode("utf-8", "replace")
        unlisted = exit_info.get("unlisted")
        if unlisted and isinstance(unlisted, str):
            # A call that removed its outbox folder, swapped it for a link or made it
            # unreadable gets no file back, and is told why: an empty outbox says it left none.
            output = with_notes(output, unlisted_note(unlisted))
        if item.skipped:
            # The model is told, in its own result, what it left that did not come back.
            output = with_notes(output, skipped_note(item.skipped))
        output = with_notes(output, memory_notes(exit_info, bound))
        return RunOutcome(
            output=output,
            exit_code=code if isinstance(code, int) else None,
            timed_out=bool(exit_info.get("timed_out")),
            dropped_chars=int(exit_info.get("dropped_chars") or 0) + item.dropped_chars,
            files=tuple(item.files),
            duration=float(exit_info.get("duration") or 0.0),
            stopped_by_limit=limit_met(exit_info),
        )

    @staticmethod
    def _exec_result(item: _Pending, header: Mapping[str, Any], bound: int) -> ExecResult:
        """The exec's result; a note on what memory bound stopped it ends its stderr
        (``bound`` as ``_outcome``'s)."""
        code = header.get("exit_code")
        timed_out = bool(header.get("timed_out"))
        dropped = header.get("dropped_bytes") or {}
        server_cut = isinstance(dropped, dict) and any(
            isinstance(n, int) and n > 0 for n in dropped.values()
        )
        return ExecResult(
            # Killed with its tree past its timeout: SIGKILL's code, as a shell would report it.
            returncode=code if isinstance(code, int) and not timed_out else -9,
            stdout=bytes(item.streams["stdout"]),
            stderr=with_notes(bytes(item.streams["stderr"]), memory_notes(header, bound).encode()),
            timed_out=timed_out,
            truncated=item.stream_cut or server_cut,
            duration=max(0.0, float(header.get("duration") or 0.0)),
            stopped_by_limit=limit_met(header),
        )

    # -- requests ----------------------------------------------------------------

    def _submit(self, item: _Pending, header: dict[str, Any], body: bytes = b"") -> int:
        if self._owner.forked():  # before the lock: a thread of the parent may have held it
            raise SandboxError(self._owner.refusal(f"this {self.backend} sandbox"))
        with self._lock:
            if self._closed:
                raise SandboxError(f"the {self.backend} sandbox session is closed")
            if self._dead is not None:
                raise SandboxError(self._dead)
            call_id = self._next_id
            self._next_id += 1
            if item.kind == "run":
                item.outbox = self._turn_outbox.root() / f"call-{call_id}"
            self._pending[call_id] = item
        try:
            # Checked before sending: a frame the server must refuse would end the session.
            frame = _protocol.encode(dict(header, id=call_id), body)
        except _protocol.FrameTooLarge as exc:
            self._finish(call_id)
            raise SandboxError(f"the request is too large to send to the sandbox ({exc})") from None
        try:
            self._send(frame)
        except SandboxError:
            self._finish(call_id)
            raise
        return call_id

    def _submit_run(self, request: RunRequest) -> tuple[int, _Pending]:
        item = _Pending("run", output_chars=request.output_chars)
        if any("\0" in part for part in request.argv):
            # NUL separates argv in the body; no argv string can hold one anyway.
            raise SandboxError("the sandbox server failed a call: argv may not contain NUL")
        # argv travels in the body, before stdin: a command line as long as the kernel
        # takes (2 MiB) would not fit the 1 MiB frame header.
        argv = b"\0".join(part.encode("utf-8", "surrogateescape") for part in request.argv)
        header = {
            "type": "run",
            "argv_bytes": len(argv),
            "cwd": request.cwd,
            "timeout": request.timeout,
            "output_chars": request.output_chars,
        }
        return self._submit(item, header, argv + request.stdin), item

    def _submit_exec(self, request: ExecRequest) -> tuple[int, _Pending]:
        item = _Pending("exec", output_bytes=request.output_bytes)
        if any("\0" in part for part in request.argv):
            raise SandboxError("the sandbox server failed a call: argv may not contain NUL")
        argv = b"\0".join(part.encode("utf-8", "surrogateescape") for part in request.argv)
        header = {
            "type": "run",
            "split": True,
            "argv_bytes": len(argv),
            "cwd": request.cwd,
            "timeout": request.timeout,
            "output_chars": 0,
            "output_bytes": request.output_bytes,
            "env": dict(request.env),
        }
        if request.user is not None:
            header["user"] = list(request.user)
        return self._submit(item, header, argv + request.stdin), item

    def _submit_detach(self, request: DetachRequest) -> tuple[int, _Pending]:
        item = _Pending("detach", output_chars=request.log_chars)
        if any("\0" in part for part in request.argv):
            raise SandboxError("the sandbox server failed a call: argv may not contain NUL")
        argv = b"\0".join(part.encode("utf-8", "surrogateescape") for part in request.argv)
        header = {
            "type": "run",
            "detach": True,
            "argv_bytes": len(argv),
            "cwd": request.cwd,
            # 0: no deadline; the process lives until the turn ends.
            "timeout": request.timeout or 0,
            "output_chars": request.log_chars,
            "env": dict(request.env),
        }
        return self._submit(item, header, argv + request.stdin), item

    def _detached(self, call_id: int, item: _Pending, request: DetachRequest) -> DetachedProcess:
        def kill() -> None:
            with contextlib.suppress(SandboxError):
                self._send(_protocol.encode({"type": "cancel", "id": call_id}))

        return DetachedProcess(request.argv, item.future, kill)

    def _submit_fs(self, request: FsRequest) -> tuple[int, _Pending]:
        item = _Pending("fs")
        header = {
            "type": _FS_MESSAGES.get(request.op, "fs"),
            "op": request.op,
            "path": request.path,
            "timeout": request.timeout,
            "offset": request.offset,
            "length": request.length,
            "limit": request.limit,
            "truncate": request.truncate,
            "make_parents": request.make_parents,
            "view": request.view,
            "arguments": dict(request.arguments),
            **request.fields,
        }
        return self._submit(item, header, request.data), item

    def _stuck(self, call_id: int, waited: float) -> SandboxError:
        message = self._death(
            f"the sandbox server did not answer request {call_id} within {waited:g} s"
        )
        self._channel.close()
        return SandboxError(message)

    def _wait(self, call_id: int, item: _Pending, limit: float) -> Any:
        try:
            return item.future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            raise self._stuck(call_id, limit) from None

    async def _await(self, call_id: int, item: _Pending, limit: float) -> Any:
        try:
            return await wait_future(item.future, limit)
        except TimeoutError:
            raise self._stuck(call_id, limit) from None
        except cancelled_exception():  # on whichever event loop is running: kill the call
            self._cancel(call_id)
            raise

    def _cancel(self, call_id: int) -> None:
        with self._lock:
            item = self._pending.pop(call_id, None)
        if item is None:
            return
        self._settle(item, exception=SandboxError("cancelled"))
        with contextlib.suppress(SandboxError):
            self._send(_protocol.encode({"type": "cancel", "id": call_id}))

    def run(self, request: RunRequest) -> RunOutcome:
        """Run one confined call in the sandbox and wait for it."""
        call_id, item = self._submit_run(request)
        outcome: RunOutcome = self._wait(call_id, item, request.timeout + _ANSWER_GRACE)
        return outcome

    async def arun(self, request: RunRequest) -> RunOutcome:
        """Async twin of ``run``; cancelling it kills the call."""
        call_id, item = self._submit_run(request)
        outcome: RunOutcome = await self._await(call_id, item, request.timeout + _ANSWER_GRACE)
        return outcome

    def exec(self, request: ExecRequest) -> ExecResult:
        """Run a host's command in the sandbox, its streams apart, and wait for it."""
        call_id, item = self._submit_exec(request)
        result: ExecResult = self._wait(call_id, item, request.timeout + _ANSWER_GRACE)
        return result

    async def aexec(self, request: ExecRequest) -> ExecResult:
        """Async twin of ``exec``; cancelling it kills the command."""
        call_id, item = self._submit_exec(request)
        result: ExecResult = await self._await(call_id, item, request.timeout + _ANSWER_GRACE)
        return result

    def detach(self, request: DetachRequest) -> DetachedProcess:
        """Start a detached process; return once the server says it runs."""
        call_id, item = self._submit_detach(request)
        try:
            item.started.result(timeout=_ANSWER_GRACE)
        except concurrent.futures.TimeoutError:
            raise self._stuck(call_id, _ANSWER_GRACE) from None
        return self._detached(call_id, item, request)

    async def adetach(self, request: DetachRequest) -> DetachedProcess:
        """Async twin of ``start``."""
        call_id, item = self._submit_detach(request)
        process = self._detached(call_id, item, request)
        try:
            await wait_future(item.started, _ANSWER_GRACE)
        except TimeoutError:
            raise self._stuck(call_id, _ANSWER_GRACE) from None
        except cancelled_exception():  # nobody will hold the handle: do not leave it running
            process.kill()
            raise
        return process

    def fs(self, request: FsRequest) -> FsReply:
        """Run one file primitive in the sandbox's view, as the calls' user."""
        call_id, item = self._submit_fs(request)
        reply: FsReply = self._wait(call_id, item, request.timeout + _ANSWER_GRACE)
        return reply

    async def afs(self, request: FsRequest) -> FsReply:
        """Async twin of ``fs``."""
        call_id, item = self._submit_fs(request)
        reply: FsReply = await self._await(call_id, item, request.timeout + _ANSWER_GRACE)
        return reply

    # -- end ---------------------------------------------------------------------

    def close(self) -> None:
        """Ask the server to stop, kill the sandbox, fail what is pending. Never raises.

        In a forked child it only marks the session closed: the sandbox, its
        pipes and its outbox are the parent's (``_owner``).
        """
        if self._owner.forked():  # before the lock: a thread of the parent may have held it
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            alive = self._dead is None
        if alive and self._reader.is_alive():
            with contextlib.suppress(Exception):
                self._send(_protocol.encode({"type": "shutdown"}))
            # Let the server kill its calls itself (it knows their process groups), briefly.
            self._reader.join(timeout=2.0)
        with contextlib.suppress(Exception):
            self._channel.close()
        if self._reader.ident is not None:
            self._reader.join(timeout=5.0)
        self._fail_all(f"the {self.backend} sandbox session was closed")
        self._turn_outbox.close()

    def __enter__(self) -> ServerSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
