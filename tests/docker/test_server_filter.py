"""The Docker server's seccomp layers: the engine's cheap unconditional rules, the server's whole list.

runc spends about 25 ms of each container's life in libseccomp on the ``server``
list's conditional rules, so the engine's profile holds only the unconditional
ones and the server installs the whole list itself, as the BPF program
bubblewrap gets, before it reads its code (``server_command(first_filter=)``).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
from pathlib import Path

from astralvessel.sandbox import _seccomp

_PEERCRED = struct.Struct("3i")


def _server_pid(turn) -> int:
    channel = turn._channel
    pid, _, _ = _PEERCRED.unpack(
        channel._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return int(pid)


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_the_server_stacks_the_whole_server_list_over_the_engines(turn, docker_api):
    """Two filters on the server: the engine's, then its own, the whole ``server`` list."""
    arch = _seccomp.available_arch()
    assert arch is not None
    status = _status(_server_pid(turn))
    assert status["Seccomp"].strip() == "2"
    assert status["Seccomp_filters"].strip() == "2"
    args = docker_api.inspect_container(turn._channel.container_id)["Args"]
    assert args[-1] == _seccomp.compiled(_seccomp.SERVER, arch).hex()


def test_the_engines_profile_is_the_server_lists_unconditional_rules(turn, docker_api):
    """No argument conditions reach runc; every name the server list always refuses does."""
    options = docker_api.inspect_container(turn._channel.container_id)["HostConfig"]["SecurityOpt"]
    (text,) = [o.removeprefix("seccomp=") for o in options if o.startswith("seccomp=")]
    profile = json.loads(text)
    assert all(not entry["args"] for entry in profile["syscalls"])
    refused = {name for entry in profile["syscalls"] for name in entry["names"]}
    always = {rule.syscall for rule in _seccomp.SERVER.rules if rule.when is None}
    arch = _seccomp.available_arch()
    assert arch is not None
    assert refused == {r.syscall for r in _seccomp.SERVER.rules_for(arch) if r.when is None}
    assert refused <= always
    assert {"bpf", "keyctl", "ptrace", "io_uring_setup"} <= refused


def test_a_process_outside_the_server_still_meets_the_engines_rules(turn, docker_api):
    """``docker exec`` skips the server's own filter, not the engine's: ``keyctl`` is refused."""
    container = turn._channel.container_id
    arch = _seccomp.available_arch()
    assert arch is not None
    keyctl = _seccomp.syscall_number("keyctl", arch)
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"result = libc.syscall({keyctl}, 0, 0, 0, 0, 0)\n"  # KEYCTL_GET_KEYRING_ID
        "print(result, os.strerror(ctypes.get_errno()))\n"
    )
    exec_id = docker_api.exec_create(container, ["python3", "-c", probe])["Id"]
    output = docker_api.exec_start(exec_id).decode()
    assert output.strip() == f"-1 {os.strerror(errno.EPERM)}"


def test_unconditional_keeps_only_the_rules_without_arguments():
    """``DenyList.unconditional`` drops every argument-conditioned rule and nothing else."""
    plain = _seccomp.SERVER.unconditional(name="server_by_name")
    assert plain.name == "server_by_name"
    assert plain.rules == tuple(r for r in _seccomp.SERVER.rules if r.when is None)
    assert any(r.when is not None for r in _seccomp.SERVER.rules)
