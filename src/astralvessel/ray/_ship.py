"""How an agent folder reaches a Ray node: packed once on the host, unpacked once per node.

A turn's sandbox runs on the node that holds its actor, and mounts the agent
folder at ``/agent`` read-only from that node's disk. The folder is small (a
``vessel.toml``, tool files, the scripts they run), so the host packs it into
one archive, puts it in Ray's object store once per executor, and each node
unpacks it into a folder named by the archive's digest: every turn on that node
mounts the same copy, and a changed folder gets a new one. Data mounts are not
shipped (they may be large): they must exist at the same path on every node.
The folder of copies is the node user's own (``agents_folder``): another local
user who made it first gets no say over any turn's ``/agent``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import stat
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import attrs

from .._ground._leftovers import make_folder
from ..errors import UsageError
from ..registry import Registry

__all__ = [
    "AGENT_ARCHIVE_LIMIT",
    "agents_folder",
    "owned_alone",
    "pack_agent",
    "plain_members",
    "unpack_agent",
    "with_agent_at",
]

#: The largest agent folder shipped to the nodes; a bigger one belongs on a shared disk.
AGENT_ARCHIVE_LIMIT = 64 * 1024 * 1024


def pack_agent(folder: Path) -> bytes:
    """The agent folder as one gzip'd tar archive, its members in a stable order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_symlink():
                continue  # a link may point off the folder: the sandbox would not see it either
            archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    data = buffer.getvalue()
    if len(data) > AGENT_ARCHIVE_LIMIT:
        raise UsageError(
            f"the agent folder {folder} packs to {len(data)} bytes, more than the "
            f"{AGENT_ARCHIVE_LIMIT} shipped to Ray nodes; put its data in a mount instead"
        )
    return data


def unpack_agent(data: bytes, root: Path | None = None) -> Path:
    """This node's copy of a packed agent folder, unpacked on first use."""
    digest = hashlib.sha256(data).hexdigest()[:24]
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    base = root or agents_folder()
    target = base / digest
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=base))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        _extract(archive, staging)
    # Readable by the sandbox's unprivileged user, like a folder checked out by hand.
    os.chmod(staging, 0o755)  # noqa: S103 - the agent folder is mounted read-only for the calls
    try:
        staging.rename(target)
    except OSError:
        # Another turn on this node unpacked the same archive first; theirs is as good.
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return target


def agents_folder() -> Path:
    """This node's folder of unpacked agent folders, this user's alone.

    One per user in the temporary folder (``astralvessel-agents-UID``), so the
    turns of a node share each copy. Its name is known to every local user, who
    could make it first and then swap their own folder in as a turn's
    ``/agent``: a folder that is a link, another user's, or writable by others
    is not used, and this process unpacks into a private folder of its own
    instead (mode 0700, named for the process so a dead worker's is removed:
    one copy per worker process, not per node).
    """
    parent = tempfile.gettempdir()
    shared = Path(parent) / f"astralvessel-agents-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        shared.mkdir(mode=0o755)
    try:
        info = os.lstat(shared)
    except OSError:
        info = None
    if info is not None and owned_alone(info):
        return shared
    return _private_folder(parent)


def owned_alone(info: os.stat_result) -> bool:
    """Whether a folder's ``lstat`` says it is a real folder of this user that no one else
    may write."""
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


@functools.cache
def _private_folder(parent: str) -> Path:
    """This process's own folder of agent copies in the temporary folder ``parent``."""
    return Path(make_folder("ray-agents"))


def _extract(archive: tarfile.TarFile, folder: Path) -> None:
    """Unpack ``archive`` into ``folder``, refusing what tarfile's ``data`` filter refuses."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(folder, filter="data")
        return
    # Python 3.11.0-3.11.3 (Debian 12's is 3.11.2) has no extraction filters (a TypeError):
    # the archive is ours, but it crossed the network, so its members are checked here.
    archive.extractall(folder, members=plain_members(archive))  # noqa: S202 - members checked


def plain_members(archive: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The archive's files and folders with plain relative names, without set-id or
    group/world write bits; ``UsageError`` naming any other member (``pack_agent`` makes
    none: it ships no link, and a device or a name leaving the folder is not an agent's)."""
    members = []
    for member in archive.getmembers():
        name = PurePosixPath(member.name)
        if (
            not (member.isfile() or member.isdir())
            or name.is_absolute()
            or ".." in name.parts
            or not name.parts
        ):
            raise UsageError(f"the shipped agent archive holds a forbidden member: {member.name!r}")
        member.mode &= 0o755
        members.append(member)
    return members


def with_agent_at(registry: Registry, folder: Path) -> Registry:
    """``registry`` with its agent read from ``folder`` (this node's copy) instead."""
    agent = registry.agent
    if agent is None:
        return registry
    dockerfile = agent.dockerfile
    moved = attrs.evolve(
        agent,
        path=folder,
        dockerfile=None if dockerfile is None else folder / dockerfile.relative_to(agent.path),
    )
    return Registry(list(registry), agent=moved)
