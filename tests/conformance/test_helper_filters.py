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
from astralvessel.sandbox._policy import EGRESS_PORT

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


@pytest.fixture
def taken_over(
    backend: Sandbox, policy: Policy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SandboxSession]:
    """A turn with an egress relay, whose server runs the attacker's helpers."""
    monkeypatch.setattr(_session, "server_payload", _taken_over)
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
