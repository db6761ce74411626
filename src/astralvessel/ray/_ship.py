"""How an agent folder reaches a Ray node: packed once on the host, unpacked once per node.

A turn's sandbox runs on the node that holds its actor, and mounts the agent
folder at ``/agent`` read-only from that node's disk. The folder is small (a
``vessel.toml``, tool files, the scripts they run), so the host packs it into
one archive, puts it in Ray's object store once per executor, and each node
unpacks it into a folder named by the archive's digest: every turn on that node
mounts the same copy, and a changed folder gets a new one. Data mounts are not
shipped (they may be large): they must exist at the same path on every node.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from pathlib import Path

import attrs

from ..errors import UsageError
from ..registry import Registry

__all__ = ["AGENT_ARCHIVE_LIMIT", "pack_agent", "unpack_agent", "with_agent_at"]

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
    base = root or Path(tempfile.gettempdir()) / "astralvessel-agents"
    target = base / digest
    if target.is_dir():
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=base))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        archive.extractall(staging, filter="data")
    # Readable by the sandbox's unprivileged user, like a folder checked out by hand.
    os.chmod(staging, 0o755)  # noqa: S103 - the agent folder is mounted read-only for the calls
    try:
        staging.rename(target)
    except OSError:
        # Another turn on this node unpacked the same archive first; theirs is as good.
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return target


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
