"""A folder the host mounts but the calls cannot use is refused when the turn opens, never in a result."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel import Agent, Executor, Registry, UsageError
from astralvessel.sandbox import Mount, Policy
from astralvessel.sandbox._discovery import get_backend
from astralvessel.sandbox._reach import Identity, mode_refusal

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "field-guide"
SAMPLE = ROOT / "examples" / "sample-data"
NOBODY = Identity(uid=65534, gid=65534)


def _stat(mode: int, uid: int = 0, gid: int = 0) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))


def test_private_folder_is_refused_to_others() -> None:
    """A 0700 folder of root's cannot be read by another user; a 0755 one can, for reading only."""
    assert mode_refusal(_stat(stat.S_IFDIR | 0o700), NOBODY, writable=False) == "read or enter"
    assert mode_refusal(_stat(stat.S_IFDIR | 0o755), NOBODY, writable=False) is None
    assert mode_refusal(_stat(stat.S_IFDIR | 0o755), NOBODY, writable=True) == "write"


def test_owner_and_group_bits_apply_to_their_user() -> None:
    """The owner's bits decide for the owner, the group's for a member, as the kernel does."""
    owned = _stat(stat.S_IFDIR | 0o700, uid=65534)
    assert mode_refusal(owned, NOBODY, writable=True) is None
    grouped = _stat(stat.S_IFDIR | 0o070, gid=65534)
    assert mode_refusal(grouped, NOBODY, writable=True) is None
    assert mode_refusal(_stat(stat.S_IFREG | 0o640), NOBODY, writable=False) == "read"


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A folder as ``tempfile.mkdtemp()`` makes it: mode 0700, the host's own."""
    path = Path(tempfile.mkdtemp())
    (path / "notes.txt").write_text("otter\n")
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.mark.parametrize("name", ["bubblewrap", "nsjail", "docker", "docker-exec"])
def test_mkdtemp_mount_is_refused_when_the_turn_opens(name: str, private_dir: Path) -> None:
    """Mounting a mkdtemp() folder raises UsageError naming the path and the fix; nothing starts."""
    policy = Policy(mounts=(Mount.from_pair("/data", private_dir),))
    with pytest.raises(UsageError) as caught:
        get_backend(name).start(policy)
    message = str(caught.value)
    assert f"host path {private_dir}" in message
    assert f"chmod o+rx {private_dir}" in message


def test_writable_mount_needs_write_for_the_calls(private_dir: Path) -> None:
    """A folder others may read but not write is refused as a writable mount, and says so."""
    private_dir.chmod(0o755)
    policy = Policy(mounts=(Mount.from_pair("/data", private_dir, writable=True),))
    with pytest.raises(UsageError, match="cannot write host path") as caught:
        get_backend("bubblewrap").start(policy)
    # Each turn is another host uid: the fix is never to hand the folder to one of them.
    assert f"chmod 1777 {private_dir}" in str(caught.value)
    assert "chown" not in str(caught.value)
    readonly = Policy(mounts=(Mount.from_pair("/data", private_dir),))
    get_backend("bubblewrap").start(readonly).close()


def _write_under_umask_077(source: Path, target: Path) -> None:
    """Copy an agent folder as a program running under umask 077 writes one."""
    old = os.umask(0o077)
    try:
        for path in sorted(source.rglob("*")):
            copy = target / path.relative_to(source)
            if path.is_dir():
                copy.mkdir(parents=True)
            else:
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(path.read_bytes())
    finally:
        os.umask(old)


@pytest.mark.parametrize("readable_folders", [False, True])
def test_unreadable_agent_folder_raises_not_a_tool_result(
    tmp_path: Path, readable_folders: bool
) -> None:
    """An agent folder written under umask 077 stops the call with UsageError, not a result."""
    agent_dir = tmp_path / "agent"
    _write_under_umask_077(EXAMPLE, agent_dir)
    unreadable = agent_dir
    if readable_folders:
        # Only the files are private (a copy that kept the folders' modes): still refused.
        for folder in (agent_dir, agent_dir / "tools"):
            folder.chmod(0o755)
        unreadable = agent_dir / "tools" / "species.py"
    registry = Registry.for_agent(Agent.load(agent_dir))
    executor = Executor(registry, sandbox=get_backend("bubblewrap"), mounts={"/data": SAMPLE})
    with executor.turn() as turn, pytest.raises(UsageError) as caught:
        turn.call("species", '{"habitat": "rivers"}')
    assert f"host path {unreadable};" in str(caught.value)
    assert "/agent: the turn's own user (host uid " in str(caught.value)
    assert "one per turn) cannot read" in str(caught.value)
