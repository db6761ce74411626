"""Promises: a call cannot watch the host's activity, and its locks end with it."""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.sandbox import Mount, Policy, Sandbox, SandboxSession

from .calls import py_json
from .conftest import TEST_LIMITS


def test_inotify_and_fanotify_refused(session):
    """inotify and fanotify answer ENOSYS (tools fall back to polling); dnotify answers EPERM."""
    result = py_json(
        session,
        """
        import ctypes, fcntl, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        out = {}
        def errno_of(value):
            return value if value >= 0 else -ctypes.get_errno()
        out["inotify_init1"] = errno_of(libc.inotify_init1(0))
        out["fanotify_init"] = errno_of(libc.fanotify_init(0, 0))
        fd = os.open("/usr/bin", os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.fcntl(fd, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
            out["dnotify"] = "watching"
        except OSError as exc:
            out["dnotify"] = -exc.errno
        print(json.dumps(out))
        """,
    )
    assert result == {
        "inotify_init1": -errno.ENOSYS,
        "fanotify_init": -errno.ENOSYS,
        "dnotify": -errno.EPERM,
    }


@pytest.fixture
def shared_dir(tmp_path: Path) -> Path:
    """A host folder holding a file the host itself also locks, as SQLite would."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "db").write_text("rows\n")
    (shared / "db").chmod(0o666)
    return shared


@pytest.fixture
def shared_session(backend: Sandbox, shared_dir: Path) -> Iterator[SandboxSession]:
    """A turn with the shared folder mounted writable at /shared."""
    policy = Policy(
        workdir="/shared",
        mounts=(Mount.from_pair("/shared", shared_dir, writable=True),),
        limits=TEST_LIMITS,
    )
    turn = backend.start(policy)
    try:
        yield turn
    finally:
        turn.close()


def test_locks_on_a_mount_end_with_the_call(shared_session, shared_dir):
    """A call's flock, POSIX and OFD locks, even held by a background child, are gone once it returns."""
    result = py_json(
        shared_session,
        """
        import fcntl, json, os, struct, time
        fd = os.open("/shared/db", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.lockf(fd, fcntl.LOCK_EX, 50, 0)
        ofd = os.open("/shared/db", os.O_RDWR)
        F_OFD_SETLK = 37
        fcntl.fcntl(ofd, F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 100, 10, 0))
        out = {}
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
            out["lease"] = "taken"
        except OSError as exc:
            out["lease"] = exc.errno
        if os.fork() == 0:
            time.sleep(60)  # holds every lock through the inherited descriptors
            os._exit(0)
        out["locked"] = True
        print(json.dumps(out))
        """,
    )
    assert result == {"lease": errno.EPERM, "locked": True}
    fd = os.open(shared_dir / "db", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 50, 0)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 100)
    finally:
        os.close(fd)
