"""The node's folder of shipped agent folders: its own user's alone, and unpacked on every
Python the package supports (3.11.0-3.11.3 have no tarfile extraction filters)."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path

import pytest

from astralvessel import UsageError
from astralvessel.ray._ship import agents_folder, pack_agent, plain_members, unpack_agent

#: A user other than this process's: the squatter (nobody, which every system has).
OTHER_UID = 65534


def _squat(shared: Path, how: str, elsewhere: Path) -> None:
    """Make ``shared`` before this process does, the way another local user would."""
    if how == "a link to the squatter's folder":
        elsewhere.mkdir(mode=0o755)
        shared.symlink_to(elsewhere)
        return
    shared.mkdir()
    if how == "writable by everyone":
        shared.chmod(0o777)
    else:
        shared.chmod(0o755)
        os.chown(shared, OTHER_UID, OTHER_UID)


#: How a squatter may hold the name first; another user's folder needs root to make here.
SQUATS = ["a link to the squatter's folder", "writable by everyone"] + (
    ["another user's"] if os.geteuid() == 0 else []
)


@pytest.fixture
def tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder of the test's own, which the node's code takes as its TMPDIR."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("how", SQUATS)
def test_a_squatted_agents_folder_is_never_used(tmp_path: Path, how: str) -> None:
    """A folder at the node's well-known name that is a link, another user's or writable by
    others is passed over for a private one of this user's, and nothing lands in it."""
    shared = tmp_path / f"astralvessel-agents-{os.geteuid()}"
    _squat(shared, how, tmp_path / "squatter")
    chosen = agents_folder()
    assert chosen != shared
    info = os.lstat(chosen)
    assert (info.st_uid, info.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert agents_folder() == chosen  # one private folder per process
    assert chosen.parent == tmp_path
    assert chosen.name.startswith(f"astralvessel-ray-agents-{os.getpid()}-")
    assert list(Path(shared).iterdir()) == []


def test_the_agents_folder_is_shared_by_a_nodes_turns(tmp_path: Path) -> None:
    """Unsquatted, the well-known folder is made this user's (0755, for the sandbox's user)."""
    chosen = agents_folder()
    assert chosen == tmp_path / f"astralvessel-agents-{os.geteuid()}"
    assert os.lstat(chosen).st_mode & 0o777 == 0o755
    assert agents_folder() == chosen


def test_a_packed_agent_unpacks_on_this_python(tmp_path: Path) -> None:
    """A shipped folder comes back whole: files, folders and modes, without set-id bits."""
    agent = tmp_path / "agent"
    (agent / "tools").mkdir(parents=True)
    (agent / "vessel.toml").write_text('name = "x"\n')
    (agent / "tools" / "run.sh").write_text("echo hi\n")
    (agent / "tools" / "run.sh").chmod(0o4755)
    copy = unpack_agent(pack_agent(agent), tmp_path / "node")
    assert (copy / "vessel.toml").read_text() == 'name = "x"\n'
    assert (copy / "tools" / "run.sh").stat().st_mode & 0o7777 == 0o755


def _archive(*members: tarfile.TarInfo) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r")


def _member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    for key, value in fields.items():
        setattr(member, key, value)
    return member


@pytest.mark.parametrize(
    "member",
    [
        _member("/etc/evil"),
        _member("tools/../../evil"),
        _member("link", tarfile.SYMTYPE, linkname="/etc/passwd"),
        _member("hard", tarfile.LNKTYPE, linkname="../outside"),
        _member("node", tarfile.CHRTYPE, devmajor=1, devminor=3),
        _member("fifo", tarfile.FIFOTYPE),
    ],
    ids=lambda m: m.name,
)
def test_the_checks_of_old_pythons_refuse_what_leaves_the_folder(member: tarfile.TarInfo) -> None:
    """Where tarfile has no ``data`` filter, a member that is not a plain file or folder with
    a relative name is refused, naming it."""
    with pytest.raises(UsageError, match="forbidden member"):
        plain_members(_archive(_member("ok", size=1), member))


def test_the_checks_of_old_pythons_keep_plain_members_and_drop_set_id() -> None:
    """Plain files and folders pass, their set-id and group/world write bits dropped."""
    kept = plain_members(
        _archive(_member("tools", tarfile.DIRTYPE, mode=0o777), _member("run", mode=0o6775, size=2))
    )
    assert [(m.name, m.mode) for m in kept] == [("tools", 0o755), ("run", 0o755)]
