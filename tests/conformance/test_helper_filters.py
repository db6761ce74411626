"""The server's helpers, taken over, still cannot take another process's descriptors.

The file worker reads every path and byte of the file tools, the egress relay every
byte a call sends out: a bug in either could hand a model code execution there. Each
stacks a filter of its own over the server's (``_seccomp.HELPERS``), so the server's
allowances, ``pidfd_getfd`` first, are not theirs.

The attacker here is the model after such a bug: the turn's server is booted with its
file worker's handler and its relay's accept replaced by code that tries
``pidfd_getfd`` on the server's stdin (the host's frames), then opening it and the
server's memory through ``/proc``, and reports what the kernel answered, in the file
tools' reply and to the call that connects. A helper holds the calls' identity
(``_launch.become_call_user``), so the second door is shut as well. Everything else (the
backend's sandbox, the server, its filter, the helpers' setup and their own filters)
is the real thing.
"""

from __future__ import annotations

import errno
import functools
import json
import marshal
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from astralvessel.sandbox import FsRequest, Policy, Sandbox, SandboxSession, _session
from astralvessel.sandbox._policy import EGRESS_PORT, Promise

from .calls import py_json

# Stdlib only, as the server: what a helper taken over would try first. pidfd_open and
# pidfd_getfd have one number on x86_64 and arm64 alike. A filter refuses pidfd_getfd
# whatever its arguments (EPERM), where the kernel would answer an empty descriptor with
# EBADF: "filter" tells the two apart on every backend and identity. "server" is the
# attack itself: the server's descriptor 0, the host's frames.
_STEAL = """
def _steal():
    import ctypes, json
    libc = ctypes.CDLL(None, use_errno=True)

    def call(number, *args):
        ctypes.set_errno(0)
        done = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
        return done if done >= 0 else -ctypes.get_errno()

    found = {"filter": call(438, -1, -1, 0)}
    pidfd = call(434, os.getppid(), 0)
    found["pidfd_open"] = pidfd
    found["server"] = call(438, pidfd, 0, 0) if pidfd >= 0 else None
    for door in ("fd/0", "mem"):  # the same descriptor, and the server's memory, by path
        try:
            os.close(os.open("/proc/%d/%s" % (os.getppid(), door), os.O_RDONLY))
        except OSError as exc:
            found[door] = -exc.errno
        else:
            found[door] = 0
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        found[name] = int(fields[name], 16)
    try:
        child = os.fork()
    except OSError as exc:
        found["fork"] = -exc.errno
    else:
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        found["fork"] = 0
    return json.dumps(found).encode()
"""
_FILE_WORKER = (
    _STEAL
    + """
def handle(header, body, ctx):
    return {}, _steal()
"""
)
_RELAY = (
    _STEAL
    + """
def _accept(self):
    client, _ = self.listener.accept()
    client.setblocking(True)
    client.sendall(_steal())
    client.close()

_Relay._accept = _accept
"""
)


@functools.cache
def _taken_over(build: object = None) -> bytes:
    """The server's payload with both helpers' entry points the attacker's.

    Compiled by this interpreter, as the real payload is: a sandbox on another Python
    (a Docker image's) compiles the sources itself, as it would for the real one.
    """
    sources = dict(_session._sources())
    sources["_fsops"] += _FILE_WORKER
    sources["_relay"] += _RELAY
    code = marshal.dumps(_session._compiled(sources))
    tag = [sys.hexversion, sys.implementation.cache_tag]
    return marshal.dumps({"tag": tag, "code": code, "src": sources}, 4)


class _NoPidNamespace(dict[str, dict[str, str]]):
    """The host's record of probe answers, saying of every way to start a turn that the
    sandbox cannot give a call a PID namespace: the server then takes this answer for its
    own probe's and starts calls beside itself, without namespaces of their own."""

    def get(self, key: str, default: object = None) -> dict[str, str]:
        return {"pid_namespace": "planted by the test"}


#: How the turn's calls start: each in namespaces of its own, or (the host relaxed process
#: isolation where a sandbox cannot give them) beside the server.
LAUNCHES = ("own namespaces", "no pid namespace")


@pytest.fixture(params=LAUNCHES)
def taken_over(
    request: pytest.FixtureRequest,
    backend: Sandbox,
    policy: Policy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[SandboxSession]:
    """A turn with an egress relay, whose server runs the attacker's helpers."""
    monkeypatch.setattr(_session, "server_payload", _taken_over)
    if request.param == "no pid namespace":
        monkeypatch.setattr(_session, "_PROBED", _NoPidNamespace())
        policy = policy.relax(Promise.PROCESS_ISOLATION, Promise.NO_NEW_SESSIONS)
    egress = tmp_path / "egress"
    egress.mkdir()
    egress.chmod(0o755)
    networked = attrs.evolve(
        policy, network_allow=("pkgs.test",), egress_socket=egress / "proxy.sock"
    )
    turn = backend.start(networked)
    try:
        yield turn
    finally:
        turn.close()


def _refused(found: dict[str, int]) -> None:
    assert found["filter"] == -errno.EPERM, f"pidfd_getfd is not filtered: {found}"
    assert found["pidfd_open"] >= 0, found  # the attack reached its pidfd_getfd
    assert found["server"] == -errno.EPERM, f"took a descriptor of the server: {found}"
    assert found["fork"] == -errno.EPERM, f"started a process: {found}"
    assert found["fd/0"] < 0, f"opened the server's descriptor through /proc: {found}"
    assert found["mem"] < 0, f"opened the server's memory: {found}"
    # Effective, permitted, ambient: nothing to use. The bounding set: nothing an exec could
    # hand back, in the helpers' own user namespace or, where they have none, after the drop.
    held = {name: found[name] for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}
    assert held == dict.fromkeys(held, 0), f"holds capabilities a call lacks: {found}"


def test_helpers_cannot_take_another_process_s_descriptors(
    taken_over: SandboxSession,
) -> None:
    """pidfd_getfd on the server's descriptor is refused in the file worker and the relay, and
    neither opens it, or the server's memory, through /proc."""
    reply = taken_over.fs(FsRequest(op="read", path="/data/species.txt", timeout=10))
    _refused(json.loads(reply.data))
    # A call of the turn talks to the relay, as a call using the network allow-list does.
    _refused(
        py_json(
            taken_over,
            f"""
            import socket
            with socket.create_connection(("127.0.0.1", {EGRESS_PORT}), timeout=10) as s:
                print(s.makefile("rb").read().decode())
            """,
        )
    )


def test_calls_beside_the_server_cannot_read_it(taken_over: SandboxSession) -> None:
    """A call that shares the server's PID namespace (and, where there is no uid to drop to,
    its uid) holds no capability and opens none of the /proc entries of the server, its file
    worker and its relay (which hold no capability either, so only not being dumpable shuts
    theirs)."""
    taken_over.fs(FsRequest(op="read", path="/data/species.txt", timeout=10))  # the worker runs
    found = py_json(
        taken_over,
        """
        import json, os
        def status(pid):
            with open("/proc/%s/status" % pid) as lines:
                return dict(line.split(":", 1) for line in lines if ":" in line)
        caps = status("self")
        found = {name: int(caps[name], 16) for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}
        # Beside the server: it, and its other children (the helpers); in a PID namespace of
        # its own, the call's init.
        parent = os.getppid()
        targets = [parent]
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    if int(status(pid)["PPid"]) == parent:
                        targets.append(int(pid))
                except (OSError, KeyError):
                    pass
        reached = []
        for pid in targets:
            for door in ("environ", "mem"):
                try:
                    os.close(os.open("/proc/%d/%s" % (pid, door), os.O_RDONLY))
                    reached.append("%d/%s" % (pid, door))
                except OSError:
                    pass
            # The folder may list (its owner may be the call's host uid); no entry may be named.
            try:
                fds = os.listdir("/proc/%d/fd" % pid)
            except OSError:
                fds = []
            for fd in fds:
                try:
                    reached.append(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
                except OSError:
                    pass
        found["reached"] = reached
        print(json.dumps(found))
        """,
    )
    held = {name: found.pop(name) for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}
    assert held == dict.fromkeys(held, 0), f"a call holds capabilities: {held}"
    assert found["reached"] == [], f"a call reached the server's or a helper's /proc: {found}"
