"""The server's rule for adopting a warm sandbox (``server/_adopt``): which it refuses; and
what carries Docker's adoption socket to its server (``docker/_adoption``, the hello)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from astralvessel.sandbox._base import ServerOptions
from astralvessel.sandbox._policy import Policy
from astralvessel.sandbox._server_hello import hello_message
from astralvessel.sandbox.server import _adopt
from astralvessel.sandbox.server._launch import LaunchPlan
from astralvessel.sandbox.server._messages import MAX_LAYERS, Hello

#: The name the server gives EOPNOTSUPP (``errno.errorcode``'s: ENOTSUP on Linux).
NOT_SUPPORTED = errno.errorcode[errno.EOPNOTSUPP]


def hello(**changes: object) -> Hello:
    """A confined turn's hello with an adoption socket, changed by ``changes``."""
    options = ServerOptions(confine=True, adopt_socket=5)
    return hello_message(Policy(), options, file_worker_idle=30.0).replace(**changes)


def plan(confine: bool = True) -> LaunchPlan:
    return LaunchPlan(
        confine=confine,
        pid_namespace=True,
        drop_uid=None,
        drop_gid=None,
        limits=None,
        seccomp=None,
        install_seccomp=None,
    )


def errno_of(answer: object) -> str:
    assert isinstance(answer, dict)
    return str(answer["error"]["errno"])


def test_a_fresh_confined_sandbox_may_be_adopted() -> None:
    """Nothing asked of it yet, its workspace its own tmpfs: no refusal."""
    assert hello().adopt_socket == 5
    assert _adopt.refusal(hello(), plan(), {}, "") is None


def test_a_touched_sandbox_is_refused() -> None:
    """Any request before the adoption rules it out (EBUSY), whatever the request was."""
    assert errno_of(_adopt.refusal(hello(), plan(), {}, "a 'run' request")) == "EBUSY"


def test_a_workspace_already_on_a_layer_is_refused() -> None:
    """A sandbox started on a snapshot's layer is never laid again (EEXIST)."""
    lowered = hello(workspace_lower="/lower")
    assert errno_of(_adopt.refusal(lowered, plan(), {}, "")) == "EEXIST"


def test_a_turn_with_a_network_is_refused() -> None:
    """A sandbox with an egress proxy belongs to the turn the proxy was started for."""
    networked = hello(egress={"socket": "/run/egress.sock", "port": 3128})
    assert errno_of(_adopt.refusal(networked, plan(), {}, "")) == NOT_SUPPORTED


def test_a_workspace_that_is_no_tmpfs_of_its_own_is_refused() -> None:
    """An unconfined plan's workspace is a host folder (EOPNOTSUPP), as is a mapped one."""
    assert errno_of(_adopt.refusal(hello(), plan(confine=False), {}, "")) == NOT_SUPPORTED
    mapped = {"/workspace": "/host/folder"}
    assert errno_of(_adopt.refusal(hello(), plan(), mapped, "")) == NOT_SUPPORTED


def test_a_writable_root_is_refused() -> None:
    """The writable root's layers live in the workspace's tmpfs the overlay would cover."""
    writable = hello(writable_root=["/usr"])
    assert errno_of(_adopt.refusal(writable, plan(), {}, "")) == NOT_SUPPORTED


def test_no_layer_waiting_is_refused() -> None:
    """An adoption whose layer never came (or no socket) fails before anything is laid."""
    with pytest.raises(OSError, match="without an adoption socket"):
        _adopt.take_layers(None)
    host, server = socket.socketpair()
    try:
        with pytest.raises(OSError, match="no layer was passed"):
            _adopt.take_layers(os.dup(server.fileno()))
    finally:
        host.close()
        server.close()


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_more_layers_than_a_stack_holds_are_refused_and_closed(tmp_path: Path) -> None:
    """Past ``MAX_LAYERS`` the server lays nothing (E2BIG), and closes every descriptor
    that came, rather than lay a stack cut short."""
    host, server = socket.socketpair()
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        before = _open_fds()
        socket.send_fds(host, [b"L"], [folder] * (MAX_LAYERS + 3))
        with pytest.raises(OSError, match=f"{MAX_LAYERS} at most") as refused:
            _adopt.take_layers(server.fileno())
        assert refused.value.errno == errno.E2BIG
        assert _open_fds() == before
    finally:
        os.close(folder)
        host.close()
        server.close()


def test_what_is_no_read_only_folder_mount_is_refused(tmp_path: Path) -> None:
    """A descriptor that is no folder, or a folder the host could write through, is no
    frozen layer: refused before any is laid, and every one passed closed."""
    read_end, write_end = os.pipe()
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match="layer 0 is no folder"):
            _adopt.checked_layers([read_end])
        with pytest.raises(OSError, match="layer 0 is no read-only mount"):
            _adopt.checked_layers([folder])
        host, server = socket.socketpair()
        try:
            before = _open_fds()
            socket.send_fds(host, [b"L"], [folder, read_end])
            with pytest.raises(OSError, match="no read-only mount"):
                _adopt.take_layers(server.fileno())
            assert _open_fds() == before
        finally:
            host.close()
            server.close()
    finally:
        for fd in (read_end, write_end, folder):
            os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's host clones a staged tree")
def test_a_stack_of_detached_read_only_mounts_is_taken_top_first(tmp_path: Path) -> None:
    """Every layer the host passed in its one message is taken, in its order; a folder
    inside a read-only mount is no layer (its parent is that mount's), so it is refused."""
    from astralvessel._ground._mounts import detached_clone

    for name in ("top", "middle", "bottom"):
        (tmp_path / name / "inner").mkdir(parents=True)
    clones = [detached_clone(str(tmp_path / name)) for name in ("top", "middle", "bottom")]
    inner = os.open("inner", os.O_RDONLY | os.O_DIRECTORY, dir_fd=clones[0])
    host, server = socket.socketpair()
    try:
        with pytest.raises(OSError, match="layer 1 is no detached mount's root"):
            _adopt.checked_layers([clones[0], inner])
        socket.send_fds(host, [b"L"], clones)
        taken = _adopt.take_layers(server.fileno())
        try:
            assert [os.fstat(fd).st_ino for fd in taken] == [os.fstat(fd).st_ino for fd in clones]
        finally:
            for fd in taken:
                os.close(fd)
    finally:
        for fd in (*clones, inner):
            os.close(fd)
        host.close()
        server.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's host clones a staged tree")
def test_the_hosts_clone_of_a_tree_is_read_only(tmp_path: Path) -> None:
    """The clone root's host passes an adopted sandbox is a read-only, nosuid, nodev
    mount: nothing can write the store's tree through it."""
    from astralvessel._ground._mounts import detached_clone

    (tmp_path / "f").write_text("base")
    clone = detached_clone(str(tmp_path))
    try:
        with pytest.raises(OSError, match="Read-only file system") as refused:
            os.open("new", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=clone)
        assert refused.value.errno == errno.EROFS
        flags = os.fstatvfs(clone).f_flag
        assert flags & os.ST_RDONLY
        assert flags & os.ST_NOSUID
        assert flags & os.ST_NODEV
    finally:
        os.close(clone)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_the_hello_carries_the_layer_then_the_adoption_socket() -> None:
    """Over a socket channel (Docker's direct one) the hello brings the descriptors the
    options pass, in the order the server takes them; none where none is passed."""
    from astralvessel.sandbox._session import _passed_with_hello

    def options(**fields: object) -> ServerOptions:
        return ServerOptions(confine=True, **fields)  # type: ignore[arg-type]

    policy = Policy(workspace_lower_fd=7)
    assert _passed_with_hello(policy, options()) == ()
    assert _passed_with_hello(policy, options(pass_lower_fd=True)) == (7,)
    assert _passed_with_hello(Policy(), options(adopt_socket=9, pass_adopt_socket=True)) == (9,)
    assert _passed_with_hello(Policy(), options(adopt_socket=9)) == ()
    both = options(pass_lower_fd=True, adopt_socket=9, pass_adopt_socket=True)
    assert _passed_with_hello(policy, both) == (7, 9)


def test_a_docker_sandbox_is_adoptable_only_when_asked_over_the_direct_channel() -> None:
    """Docker's adoption socket pair is made only for an adoptable policy whose workspace
    lies on no layer, a leased uid and the direct channel (the attach stream passes none)."""
    from astralvessel.sandbox._uids import UidLease
    from astralvessel.sandbox.docker._adoption import adoption_pair, close_pair

    lease = UidLease.__new__(UidLease)
    adoptable = Policy(adoptable=True)
    host_end, server_end = adoption_pair(adoptable, lease, direct=True)
    try:
        assert host_end is not None
        assert server_end is not None
    finally:
        assert close_pair(host_end, server_end) == (None, None)
    for policy, leased, direct in (
        (Policy(), lease, True),
        (adoptable, None, True),
        (adoptable, lease, False),
        (Policy(adoptable=True, workspace_lower_fd=7), lease, True),
        (Policy(adoptable=True, workspace_lower=Path("/lower")), lease, True),
    ):
        assert adoption_pair(policy, leased, direct=direct) == (None, None)
