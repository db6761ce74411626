"""The filesystem a turn's sandbox shows, as a list of steps each backend compiles.

``sandbox_layout`` turns a ``Policy`` and the host's facts into ordered mount
steps (bind, symlink, tmpfs, directory). bubblewrap and nsjail each translate
the same steps into their own options, so both show exactly the same view:
the system dirs, a synthetic ``/etc`` (``_etc``), ``/agent``, the workdir and
data mounts (read-only unless the host mounted them writable), the server's
interpreter, and the size-limited workspace (the server creates ``outbox`` in
it). Nothing else of the host.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import attrs

from ..errors import UsageError
from ._etc import HOSTNAME, SYNTHETIC, etc_dir
from ._hostinfo import HostFacts, interpreter_mount
from ._policy import (
    AGENT_DIR,
    EGRESS_DIR,
    ROOT_DIRS,
    WORKSPACE_DIR,
    WORKSPACE_LOWER_DIR,
    Policy,
)

__all__ = [
    "DEVICES",
    "DEVICE_LINKS",
    "HOSTNAME",
    "Bind",
    "Dir",
    "Step",
    "Symlink",
    "Tmpfs",
    "sandbox_layout",
]

#: Device nodes a program expects; each is harmless (no disk, no terminal, no kernel memory).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEVICE_LINKS = (
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
)


#: Built from ``_etc`` instead of bound from the host.
ETC = PurePosixPath("/etc")
#: The workspace tmpfs starts root-owned and private; the server hands it (and the
#: outbox it creates inside) to the call's unprivileged user at hello.
WORKSPACE_MODE = 0o755


@attrs.frozen(kw_only=True)
class Bind:
    """Show host ``source`` at sandbox ``target``; read-only unless ``writable``."""

    source: str
    target: str
    writable: bool = False


@attrs.frozen(kw_only=True)
class Symlink:
    """Create symlink ``path`` pointing at ``link`` (merged-/usr hosts: ``/bin -> usr/bin``)."""

    link: str
    path: str


@attrs.frozen(kw_only=True)
class Tmpfs:
    """A fresh tmpfs at ``path`` of at most ``size_bytes`` and ``inodes`` entries (if given)."""

    path: str
    size_bytes: int
    mode: int = WORKSPACE_MODE
    inodes: int | None = None


@attrs.frozen(kw_only=True)
class Dir:
    """An empty directory at ``path`` (on the tmpfs above it)."""

    path: str
    mode: int = 0o755


Step = Bind | Symlink | Tmpfs | Dir


def _covered(path: PurePosixPath, targets: list[PurePosixPath]) -> bool:
    return any(path == t or t in path.parents for t in targets)


def _etc_steps(facts: HostFacts) -> list[Step]:
    """The sandbox's /etc: the synthetic files, then the host entries tools need."""
    synthetic = etc_dir(facts.runtime_dir)
    # No Dir step: both tools create /etc on their own read-only root for the binds.
    steps: list[Step] = [
        Bind(source=f"{synthetic}/{name}", target=str(ETC / name)) for name in sorted(SYNTHETIC)
    ]
    steps += [Bind(source=entry, target=entry) for entry in facts.etc_entries]
    return steps


def _lower_source(lower: object) -> str:
    """The snapshot's tree as a bind's source; never a path in ``/proc`` (a descriptor's
    ``/proc/self/fd/N`` above all).

    bubblewrap binds a path by its text, and a detached mount's (a frozen layer's held
    by fd) reads "/": it would bind the host's root. A frozen layer is staged at a
    path of the store (``Tree.frozen``) before any turn opens from it, or, held by an
    ordinary user's host, passed as a descriptor (``Policy.workspace_lower_fd``).
    """
    source = str(lower)
    parts = PurePosixPath(source).parts
    if len(parts) >= 2 and parts[1] == "proc":
        raise UsageError(f"workspace_lower must be a tree's path, not one in /proc: {source}")
    return source


def sandbox_layout(policy: Policy, facts: HostFacts) -> tuple[Step, ...]:
    """The ordered mount steps that build ``policy``'s view on a host described by ``facts``."""
    steps: list[Step] = []
    targets: list[PurePosixPath] = []
    for sysdir in facts.system_dirs:
        if sysdir.path == ETC:
            # The host's /etc names the host: the sandbox gets its own (below).
            continue
        if sysdir.symlink is not None:
            steps.append(Symlink(link=sysdir.symlink, path=str(sysdir.path)))
        else:
            steps.append(Bind(source=str(sysdir.path), target=str(sysdir.path)))
            targets.append(sysdir.path)
    steps += _etc_steps(facts)
    targets.append(ETC)
    if policy.writable_root:
        # Empty directories the server covers with the turn's layers (see server/_rootfs).
        steps += [Dir(path=str(d)) for d in ROOT_DIRS]
    prefix = interpreter_mount(facts.python, facts.system_dirs)
    if prefix is not None:
        # The server runs on the host's own interpreter; it is read-only and, as
        # only its own path is mounted, its parents show nothing else of the host.
        steps.append(Bind(source=prefix, target=prefix))
    if policy.agent_dir is not None:
        steps.append(Bind(source=str(policy.agent_dir), target=str(AGENT_DIR)))
        targets.append(AGENT_DIR)
    # Parents before children, so a mount inside another mount stays visible.
    for mount in sorted(policy.mounts, key=lambda m: (len(m.target.parts), str(m.target))):
        steps.append(
            Bind(source=str(mount.source), target=str(mount.target), writable=mount.writable)
        )
        targets.append(mount.target)
    if policy.egress_socket is not None:
        # The folder holding the host's egress proxy socket: only the server's relay
        # connects to it (calls cannot open unix sockets), read-only like every bind.
        # Its parent made traversable first: the relay runs as the calls' uid.
        steps.append(Dir(path=str(EGRESS_DIR.parent)))
        steps.append(Bind(source=str(policy.egress_socket.parent), target=str(EGRESS_DIR)))
    if policy.workspace_lower is not None:
        # The snapshot's tree, read-only: the server lays the workspace's overlay on it.
        steps.append(
            Bind(source=_lower_source(policy.workspace_lower), target=str(WORKSPACE_LOWER_DIR))
        )
    for index, layer in enumerate(policy.workspace_layers):
        # A stack of frozen layers, each read-only, top first (``Hello.workspace_layers``).
        target = str(WORKSPACE_LOWER_DIR / str(index))
        steps.append(Bind(source=_lower_source(layer), target=target))
    limits = policy.limits
    steps.append(
        Tmpfs(
            path=str(WORKSPACE_DIR),
            size_bytes=limits.disk_mb * 1024 * 1024,
            inodes=limits.workspace_inodes,
        )
    )
    targets.append(WORKSPACE_DIR)
    if not _covered(policy.workdir, targets):
        # A workdir nobody mounted still exists, empty, so calls can start in it.
        steps.append(Dir(path=str(policy.workdir)))
    return tuple(steps)
