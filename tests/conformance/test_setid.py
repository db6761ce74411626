"""Promise: a call cannot leave a set-id file on the host through a writable mount."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.sandbox import Mount, Policy, Sandbox, SandboxSession

from .calls import py_json, run
from .conftest import TEST_LIMITS

SETID = stat.S_ISUID | stat.S_ISGID


@pytest.fixture
def outbox_dir(tmp_path: Path) -> Path:
    """A host folder the turn may write, as a host collecting results would mount it."""
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    return out


@pytest.fixture
def rw_session(backend: Sandbox, outbox_dir: Path) -> Iterator[SandboxSession]:
    """A turn with the host folder mounted writable at /out."""
    policy = Policy(
        workdir="/out",
        mounts=(Mount.from_pair("/out", outbox_dir, writable=True),),
        limits=TEST_LIMITS,
    )
    turn = backend.start(policy)
    try:
        yield turn
    finally:
        turn.close()


def test_no_setid_copy_reaches_the_host(rw_session, outbox_dir):
    """Every way to give a copied binary a set-id mode fails, and the host folder holds none."""
    result = py_json(
        rw_session,
        """
        import ctypes, json, os, shutil, stat
        libc = ctypes.CDLL(None, use_errno=True)
        program = open("/usr/bin/python3", "rb").read()
        out = {}
        def attempt(name, action):
            try:
                action()
                out[name] = "done"
            except OSError as exc:
                out[name] = exc.errno
        def create(path, flags, mode):
            fd = os.open(path, flags | os.O_WRONLY, mode)
            os.write(fd, program)
            os.close(fd)
        plain = "/out/plain"
        create(plain, os.O_CREAT, 0o755)
        attempt("chmod", lambda: os.chmod(plain, 0o4755))
        attempt("chmod g+s", lambda: os.chmod(plain, 0o2755))
        attempt("fchmod", lambda: os.fchmod(os.open(plain, os.O_RDONLY), 0o6755))
        attempt("open O_CREAT", lambda: create("/out/created", os.O_CREAT, 0o4755))
        attempt("open O_TMPFILE", lambda: os.open("/out", os.O_TMPFILE | os.O_WRONLY, 0o4755))
        attempt("mknod", lambda: os.mknod("/out/node", stat.S_IFREG | 0o4755))
        def fchmodat2():
            if libc.syscall(452, -100, plain.encode(), 0o4755, 0) != 0:
                raise OSError(ctypes.get_errno(), "fchmodat2")
        attempt("fchmodat2", fchmodat2)
        def creat():
            fd = libc.creat(b"/out/creat", 0o4755)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "creat")
        attempt("creat", creat)
        attempt("plain chmod", lambda: os.chmod(plain, 0o700))
        print(json.dumps(out))
        """,
    )
    refused = {name: err for name, err in result.items() if name != "plain chmod"}
    assert set(refused.values()) <= {errno.EPERM, errno.ENOSYS}, result
    assert result["plain chmod"] == "done"
    on_host = {p.name: oct(p.lstat().st_mode) for p in outbox_dir.rglob("*")}
    assert not [p for p in outbox_dir.rglob("*") if p.lstat().st_mode & SETID], on_host


def test_writable_mount_is_nosuid_and_nodev(rw_session):
    """Inside the sandbox the writable mount carries nosuid and nodev."""
    options = py_json(
        rw_session,
        """
        import json
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            if fields[4] == "/out":
                print(json.dumps(fields[5].split(",")))
        """,
    )
    assert {"nosuid", "nodev"} <= set(options)


def test_host_setid_file_grants_nothing(rw_session, outbox_dir):
    """A set-uid file the host put in the mount does not raise a call's privileges."""
    target = outbox_dir / "id"
    target.write_bytes(Path("/usr/bin/id").read_bytes())
    os.chmod(target, 0o4755)  # noqa: S103 -- the host's own set-uid file is the test
    result = py_json(
        rw_session,
        """
        import json, subprocess
        print(json.dumps(subprocess.run(["/out/id", "-u"], capture_output=True, text=True).stdout.split()))
        """,
    )
    own = run(rw_session, "id", "-u").output.split()
    assert result == own
    assert own != ["0"]
