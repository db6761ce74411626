"""``server/_freeze.freeze_workspace`` alone, on a tmpfs of a child's own mount namespace:
what a refusal or a failed step leaves (the tmpfs writable, no overlay, nothing held).

The child is root, or uid 0 of a user namespace of its own (an ordinary user), as the
sandbox's server is; each check runs in a fork that reports its findings on a pipe.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

from astralvessel.sandbox.server import _freeze, _sys

_CLONE_NEWUSER = 0x10000000


def _own_namespaces() -> None:
    """Enter a mount namespace (and, not root, a user namespace) of this process's own."""
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        _sys.unshare(_CLONE_NEWUSER)
        with open("/proc/self/setgroups", "w") as handle:
            handle.write("deny")
        with open("/proc/self/uid_map", "w") as handle:
            handle.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as handle:
            handle.write(f"0 {gid} 1")
    _sys.unshare(_sys.CLONE_NEWNS)
    _sys.mount(None, "/", None, _sys.MS_REC | _sys.MS_PRIVATE)


def _in_child(check: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Run ``check`` on a fresh tmpfs in a forked child of its own namespaces."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            os.close(read_end)
            _own_namespaces()
            where = tempfile.mkdtemp()
            _sys.mount("none", where, "tmpfs", _sys.MS_NOSUID | _sys.MS_NODEV, "size=1m")
            with open(os.path.join(where, "a.txt"), "w") as handle:
                handle.write("hello")
            os.write(write_end, json.dumps(check(where)).encode())
            code = 0
        except BaseException as exc:
            os.write(write_end, json.dumps({"child failed": repr(exc)}).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        found = json.loads(reader.read() or b"{}")
    os.waitpid(pid, 0)
    return dict(found)


def _state(where: str) -> dict[str, Any]:
    """Whether the tmpfs at ``where`` is writable, still a tmpfs, and what it holds."""
    try:
        with open(os.path.join(where, "b.txt"), "w") as handle:
            handle.write("more")
        writable = True
    except OSError:
        writable = False
    tmpfs = _freeze.filesystem_type(where) == _freeze.TMPFS_MAGIC
    return {"writable": writable, "tmpfs": tmpfs, "names": sorted(os.listdir(where))}


def _refused(where: str, step: Callable[[], object]) -> dict[str, Any]:
    try:
        step()
    except OSError as exc:
        return {"errno": exc.errno, **_state(where)}
    return {"errno": None, **_state(where)}


def _userxattr() -> bool:
    return os.geteuid() != 0


def test_the_freeze_alone_works_here() -> None:
    """The steps on a plain tmpfs: the clone read-only, the workspace an overlay above it."""

    def check(where: str) -> dict[str, Any]:
        clone = _freeze.freeze_workspace(where, 1 << 20, 0, userxattr=_userxattr())
        through = None
        try:
            os.mkdir("x", dir_fd=clone)
        except OSError as exc:
            through = exc.errno
        return {"through_clone": through, **_state(where)}

    found = _in_child(check)
    assert found == {
        "through_clone": errno.EROFS,
        "writable": True,
        "tmpfs": False,
        "names": ["a.txt", "b.txt"],
    }


def test_a_file_open_for_writing_leaves_everything_as_it_was() -> None:
    """EBUSY: the tmpfs stays writable, nothing is mounted on it."""

    def check(where: str) -> dict[str, Any]:
        held = os.open(os.path.join(where, "held"), os.O_WRONLY | os.O_CREAT, 0o600)
        found = _refused(
            where, lambda: _freeze.freeze_workspace(where, 1 << 20, 0, userxattr=_userxattr())
        )
        os.close(held)
        return found

    assert _in_child(check) == {
        "errno": errno.EBUSY,
        "writable": True,
        "tmpfs": True,
        "names": ["a.txt", "b.txt", "held"],
    }


def test_a_step_failing_after_the_freeze_thaws_the_tmpfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overlay refused (here: made to fail): the tmpfs is writable again, no overlay."""

    def broken(*args: object) -> None:
        raise OSError(errno.EINVAL, "create the overlay: made to fail")

    monkeypatch.setattr(_freeze, "_overlay", broken)

    def check(where: str) -> dict[str, Any]:
        return _refused(
            where, lambda: _freeze.freeze_workspace(where, 1 << 20, 0, userxattr=_userxattr())
        )

    assert _in_child(check) == {
        "errno": errno.EINVAL,
        "writable": True,
        "tmpfs": True,
        "names": ["a.txt", "b.txt"],
    }


def test_a_workspace_that_is_no_tmpfs_is_refused() -> None:
    """An overlay (a workspace frozen already): EOPNOTSUPP before anything is done."""

    def check(where: str) -> dict[str, Any]:
        os.close(_freeze.freeze_workspace(where, 1 << 20, 0, userxattr=_userxattr()))
        return _refused(
            where, lambda: _freeze.freeze_workspace(where, 1 << 20, 0, userxattr=_userxattr())
        )

    found = _in_child(check)
    assert found["errno"] == errno.EOPNOTSUPP
    assert (found["writable"], found["tmpfs"]) == (True, False)


def test_the_statfs_type_is_read_from_the_kernels_struct() -> None:
    """``filesystem_type`` reads ``f_type``: /proc is procfs here."""
    assert _freeze.filesystem_type("/proc") == 0x9FA0  # PROC_SUPER_MAGIC
