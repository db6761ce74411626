"""``FakeSandbox``: a sandbox backend that runs nothing and answers from a script.

It plugs in where a real backend does, below the executor's runners: the turn
checks the arguments, picks the runner and builds the argv and stdin exactly as
in production, and the fake's session answers the ``RunRequest`` (from a
canned text, a ``FakeRun`` or a function) or the file tool (from a few
in-memory files), then the library's own renderer turns the outcome into the
``ToolResult``. Refusals, output caps, timeouts, exit codes and a sandbox that
dies therefore read exactly as they would in production, in microseconds.

Every call that reaches the sandbox is recorded as a ``FakeCall``; the host's
own commands (``Turn.exec``) are answered from ``exec=`` and recorded as
``FakeExec`` (see ``_fakeexec``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import attrs

from ..errors import SandboxError, UnscriptedCallError, UsageError
from ..sandbox._api import BackendReport, ExecResult, FsReply, OutboxFile, RunOutcome
from ..sandbox._base import Sandbox, SandboxSession, ServerLink
from ..sandbox._policy import Policy, Promise
from ..sandbox._temporary_outbox import TurnOutbox
from ..spec import ToolSpec
from ._fakeexec import ExecScript, FakeExec, answer_detach, answer_exec, check_exec_script
from ._fakefs import FakeFiles, check_file_paths, check_visible
from ._fakegrep import fake_grep
from ._identify import identify
from ._replay import Replay

if TYPE_CHECKING:
    # The session's requests and a detached process, which the fake only names.
    from ..sandbox._api import DetachedProcess, DetachRequest, ExecRequest, FsRequest, RunRequest

__all__ = ["Answer", "FakeCall", "FakeRun", "FakeSandbox"]

#: Which built-in shows each of the server's views (for the record of calls).
_VIEW_TOOLS = {"lines": "read", "find": "glob", "entries": "list"}


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _outbox(files: Mapping[str, str | bytes]) -> Mapping[str, bytes]:
    clean: dict[str, bytes] = {}
    for name, content in files.items():
        if not name or "/" in name or name in {".", ".."}:
            raise UsageError(f"an outbox file's name is a plain file name, not {name!r}")
        clean[name] = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    return clean


@attrs.frozen(kw_only=True)
class FakeRun:
    """What one confined call does in a fake turn, as a real command would.

    ``output`` is its combined stdout and stderr; ``exit_code`` its status;
    ``timed_out`` says it ran past its timeout (the output is what it printed
    before, and the exit code is dropped, as for a killed call); ``files`` are
    left in ``$VESSEL_OUTBOX`` (name to content). ``stopped_by_limit`` says a
    bound of the turn (memory) stopped it, so its outcome is ``limit``;
    ``sandbox_died`` (a reason) makes the sandbox die under the call, so its
    result is the dead-sandbox one (``sandbox_lost``) and the next call starts a
    fresh fake turn.
    """

    output: str = attrs.field(default="", converter=_text)
    exit_code: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))
    timed_out: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    files: Mapping[str, bytes] = attrs.field(factory=dict, converter=_outbox)
    stopped_by_limit: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool)
    )
    sandbox_died: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )


@attrs.frozen(kw_only=True)
class FakeCall:
    """One call as it reached the sandbox, recorded by ``FakeSandbox``.

    ``tool`` is the tool it belongs to; ``arguments`` what the tool received
    (for ``input = "args"`` tools, each flag's value as text); ``argv`` and
    ``stdin`` what a real sandbox would have run (empty for ``read``, ``glob``
    and ``list``, which the sandbox answers itself).
    """

    tool: str
    arguments: Mapping[str, Any]
    argv: tuple[str, ...] = ()
    stdin: bytes = b""
    timeout: float = 0.0
    cwd: str | None = None


#: How the fake answers a call: output text (exit 0), a ``FakeRun``, or a function of the call.
Answer: TypeAlias = str | FakeRun | Callable[[FakeCall], str | FakeRun]


def _run_of(answer: Answer, call: FakeCall) -> FakeRun:
    value = answer(call) if callable(answer) else answer
    if isinstance(value, str):
        return FakeRun(output=value)
    if isinstance(value, FakeRun):
        return value
    raise UsageError(
        f"the fake answer for {call.tool} gave a {type(value).__name__}; give str or FakeRun"
    )


def _cut(output: str, cap: int) -> tuple[str, int]:
    # The sandbox server keeps the first ``output_chars`` characters and counts the rest.
    return output[:cap], max(0, len(output) - cap)


class FakeSandbox(Sandbox):
    """A backend for tests: answers confined calls from a script and file tools from ``files``.

    ``tools`` maps a tool's name (a declared tool, ``bash`` or ``grep``) to its
    answer; ``bash`` maps a ``bash`` command line to its answer; ``default``
    answers any other confined call (without it, such a call raises
    ``UnscriptedCallError``). ``files`` maps sandbox paths to contents that
    ``read``, ``glob``, ``list`` and an unscripted ``grep`` see, beside the
    agent folder and mounts. ``exec`` answers the host's ``Turn.exec``: a
    mapping from argv (a tuple, or its ``shlex.join`` command line) to an
    answer, or one answer for every command; an answer is the stdout text, an
    ``ExecResult`` or a function of the ``FakeExec``. Without one, an exec
    raises ``UnscriptedCallError``.
    ``registry`` tells declared tools apart by their commands; without it,
    the fake reads the agent folder the executor's policy names.

    ``FakeSandbox.from_ledger(path)`` answers calls with a turn ledger's
    recorded results instead (see ``docs/observing.md``).

    Pass it as ``Executor(registry, sandbox=FakeSandbox(...))``. ``calls``
    lists every call that reached it, in order, across turns; ``execs``
    every ``Turn.exec``.
    """

    name: ClassVar[str] = "fake"
    #: Never chosen automatically: it confines nothing, because it runs nothing.
    confined: ClassVar[bool] = False

    def __init__(
        self,
        *,
        tools: Mapping[str, Answer] | None = None,
        bash: Mapping[str, Answer] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        default: Answer | None = None,
        registry: Iterable[ToolSpec] | None = None,
        exec: ExecScript | None = None,
    ) -> None:
        self.tools: dict[str, Answer] = dict(tools or {})
        self.bash: dict[str, Answer] = dict(bash or {})
        self.files: dict[str, bytes] = check_file_paths(files or {})
        self.default = default
        self.registry = registry
        self.exec = check_exec_script(exec)
        self.calls: list[FakeCall] = []
        self.execs: list[FakeExec] = []
        #: Turns started and not yet closed: 0 once every turn a test opened has ended.
        self.open_sessions = 0
        self._lock = threading.Lock()
        self._agent_specs: dict[str, tuple[ToolSpec, ...]] = {}
        #: The ledger whose recorded answers this fake gives (``from_ledger``), if any.
        self.replay: Replay | None = None

    @classmethod
    def from_ledger(
        cls, path: str | os.PathLike[str], *, registry: Iterable[ToolSpec] | None = None
    ) -> FakeSandbox:
        """A fake answering each confined call and file tool with the ledger's record of it.

        A call is matched by its tool and arguments (equal calls in the order
        recorded); one the ledger does not hold raises ``UnscriptedCallError``
        naming how it differs from the ledger's next call. Host-side tools (Python,
        services, the web) never reach a sandbox: the executor runs them as usual.
        """
        fake = cls(registry=registry)
        fake.replay = Replay.read(Path(path))
        return fake

    def probe(self) -> BackendReport:
        """Always available; keeps no promise, because nothing runs."""
        return BackendReport(
            name=self.name,
            available=True,
            reason="a test double: answers from its script and runs nothing",
            unenforced=dict.fromkeys(Promise, "a fake sandbox runs nothing"),
        )

    def open(self, policy: Policy) -> ServerLink:
        """Never used: ``start`` builds the fake session directly, with no server."""
        raise NotImplementedError("FakeSandbox starts no server; call start()")

    def start(self, policy: Policy) -> SandboxSession:
        """Start one fake turn: lay out ``files`` for ``policy`` and answer its calls."""
        session = FakeSession(self, policy)
        with self._lock:
            self.open_sessions += 1
        return session

    def calls_to(self, tool: str) -> list[FakeCall]:
        """The recorded calls of one tool, in order."""
        return [call for call in self.calls if call.tool == tool]

    # -- what the session asks ---------------------------------------------------------------

    def _specs(self, policy: Policy) -> tuple[ToolSpec, ...]:
        if self.registry is not None:
            return tuple(self.registry)
        if policy.agent_dir is None:
            return ()
        key = str(policy.agent_dir)
        if key not in self._agent_specs:
            from ..agent import Agent

            self._agent_specs[key] = tuple(Agent.load(Path(policy.agent_dir)).tools)
        return self._agent_specs[key]

    def _record(self, call: FakeCall) -> None:
        with self._lock:
            self.calls.append(call)

    def _record_exec(self, call: FakeExec) -> None:
        with self._lock:
            self.execs.append(call)

    def _closed(self) -> None:
        with self._lock:
            self.open_sessions -= 1

    def _answer(self, call: FakeCall, candidates: tuple[str, ...]) -> Answer | None:
        answers = [self.tools[name] for name in candidates if name in self.tools]
        if len(answers) > 1:
            raise UnscriptedCallError(
                f"the tools {', '.join(candidates)} run the same command; the fake cannot tell "
                "which one the call is for, so answer only one of them"
            )
        if answers:
            return answers[0]
        if call.tool == "bash" and call.arguments.get("command") in self.bash:
            return self.bash[str(call.arguments["command"])]
        return None


class FakeSession(SandboxSession):
    """One fake turn: records each call and answers it from the sandbox's script."""

    def __init__(self, sandbox: FakeSandbox, policy: Policy) -> None:
        self.sandbox = sandbox
        self.policy = policy
        self.backend = sandbox.name
        # The files are laid out on the first call that needs them: a test that only
        # calls declared tools never touches the disk.
        self._files: FakeFiles | None = None
        check_visible(policy, sandbox.files)
        self._closed = False
        self._runs = 0
        self._lock = threading.Lock()
        # Its folder is made at the first call that leaves a file, as the real sessions' are.
        self._turn_outbox = TurnOutbox(policy.outbox_dir, "fake-outbox")

    def run(self, request: RunRequest) -> RunOutcome:
        """Identify the call, record it, and answer it as the script says."""
        found = identify(self.sandbox._specs(self.policy), request.argv, request.stdin)
        candidates = found.tools if found is not None else ()
        call = FakeCall(
            tool=candidates[0] if len(candidates) == 1 else "",
            arguments=found.arguments if found is not None else {},
            argv=request.argv,
            stdin=request.stdin,
            timeout=request.timeout,
            cwd=request.cwd,
        )
        self.sandbox._record(call)
        replay = self.sandbox.replay
        if replay is not None:
            return replay.run(call.tool, call.arguments)
        answer = self.sandbox._answer(call, candidates)
        if answer is None:
            # Unscripted grep searches the fake's files; only then does the default answer.
            answer = self._grep if call.tool == "grep" else self.sandbox.default
        if answer is None:
            raise UnscriptedCallError(
                f"the fake sandbox has no answer for {call.tool or 'this call'} "
                f"(argv {list(request.argv)[:4]}...); give it one in tools=, bash= or default="
            )
        run = _run_of(answer, call)
        if run.sandbox_died is not None:
            raise SandboxError(run.sandbox_died)
        output, dropped = _cut(run.output, request.output_chars)
        return RunOutcome(
            output=output,
            exit_code=None if run.timed_out else run.exit_code,
            timed_out=run.timed_out,
            dropped_chars=dropped,
            files=self._leave(run.files),
            stopped_by_limit=run.stopped_by_limit,
        )

    def _grep(self, call: FakeCall) -> FakeRun:
        """``grep`` over the fake's files, when the script does not answer it."""
        files = self._layout()
        # After "$0" and its seven values, the script takes the roots it may search.
        output, exit_code = fake_grep(
            call.arguments,
            workdir=str(self.policy.workdir),
            roots=call.argv[11:],
            real_path=files.real_path,
        )
        return FakeRun(output=output, exit_code=exit_code)

    async def arun(self, request: RunRequest) -> RunOutcome:
        """Async twin of ``run``: nothing here waits."""
        return self.run(request)

    def exec(self, request: ExecRequest) -> ExecResult:
        """Record the host's command and answer it from the sandbox's ``exec`` script."""
        call = self._host_exec(request)
        return answer_exec(self.sandbox.exec, call, request)

    async def aexec(self, request: ExecRequest) -> ExecResult:
        """Async twin of ``exec``: nothing here waits."""
        return self.exec(request)

    def detach(self, request: DetachRequest) -> DetachedProcess:
        """Record a ``Turn.start`` and answer it from ``exec``: a process that has exited."""
        call = self._host_exec(request, detached=True)
        return answer_detach(self.sandbox.exec, call, request)

    def _host_exec(
        self, request: ExecRequest | DetachRequest, *, detached: bool = False
    ) -> FakeExec:
        """The host's command as the fake records it (``FakeSandbox.execs``), recorded."""
        call = FakeExec(
            argv=request.argv,
            stdin=request.stdin,
            cwd=request.cwd or str(self.policy.workdir),
            env=dict(request.env),
            timeout=request.timeout,
            detached=detached,
        )
        self.sandbox._record_exec(call)
        return call

    async def adetach(self, request: DetachRequest) -> DetachedProcess:
        """Async twin of ``detach``: nothing here waits."""
        return self.detach(request)

    def fs(self, request: FsRequest) -> FsReply:
        """Answer a file primitive with the sandbox server's own code, on the fake's files.

        A file tool's view is recorded as a call of its tool, as a real sandbox
        would have run it; the host's read, write and list are not calls.
        """
        timeout = request.timeout
        if request.op == "view":
            tool = _VIEW_TOOLS.get(request.view, request.view)
            self.sandbox._record(
                FakeCall(tool=tool, arguments=dict(request.arguments), timeout=timeout)
            )
            replay = self.sandbox.replay
            if replay is not None:
                viewed = replay.view(tool, request.arguments)
                return FsReply(fields={"text": viewed.text, "is_error": viewed.is_error})
            text, is_error = self._layout().view(request.view, request.arguments, timeout)
            return FsReply(fields={"text": text, "is_error": is_error})
        header = {
            "op": request.op,
            "path": request.path,
            "offset": request.offset,
            "length": request.length,
            "limit": request.limit,
            "truncate": request.truncate,
            "make_parents": request.make_parents,
        }
        fields, data = self._layout().fs(header, request.data, timeout)
        error = fields.pop("error", None)
        if isinstance(error, dict):
            return FsReply(fields=fields, errno=str(error["errno"]), message=str(error["message"]))
        return FsReply(fields=fields, data=data)

    async def afs(self, request: FsRequest) -> FsReply:
        """Async twin of ``fs``: nothing here waits."""
        return self.fs(request)

    def _layout(self) -> FakeFiles:
        with self._lock:
            if self._files is None:
                self._files = FakeFiles(self.policy, self.sandbox.files)
            return self._files

    def _leave(self, files: Mapping[str, bytes]) -> tuple[OutboxFile, ...]:
        # As the real sessions do: a call's outbox files are taken out of the sandbox into a
        # host folder that outlives the turn while a result names one of its files.
        with self._lock:
            self._runs += 1
            runs = self._runs
        if not files:
            return ()
        folder = self._turn_outbox.root() / str(runs)
        folder.mkdir()
        left: list[OutboxFile] = []
        for name, content in sorted(files.items()):
            (folder / name).write_bytes(content)
            file = OutboxFile(name=name, size=len(content), path=folder / name)
            left.append(self._turn_outbox.adopt(file))
        return tuple(left)

    def close(self) -> None:
        """End the fake turn: remove its files, and its outbox folder once no result names a file
        in it. Never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._files is not None:
            self._files.close()
        self._turn_outbox.close()
        self.sandbox._closed()

    def alive(self) -> bool:
        """Whether the fake turn is still open."""
        return not self._closed

    def unenforced(self) -> Mapping[Promise, str]:
        """Every promise: a fake turn confines nothing."""
        return dict.fromkeys(Promise, "a fake sandbox runs nothing")
