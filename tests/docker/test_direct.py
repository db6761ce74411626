"""The direct channel: a turn's server speaks over a unix socket of its own, not the attach stream."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from astralvessel._ground._leftovers import is_leftover, owned_prefix
from astralvessel.errors import BackendUnavailableError
from astralvessel.sandbox import Mount, Policy, RunRequest
from astralvessel.sandbox.docker import Docker, _direct
from astralvessel.sandbox.docker._attach import AttachChannel
from astralvessel.sandbox.docker._direct import DirectChannel, Listener
from astralvessel.sandbox.docker._spec import (
    CHANNEL_DIR,
    CHANNEL_SOCKET,
    LABEL_OWNER,
    container_spec,
)
from astralvessel.sandbox.docker._starting import Starting

from .conftest import BASE_IMAGE, SMALL_LIMITS

_PEERCRED = struct.Struct("3i")


def _run(session, *argv: str) -> object:
    return session.run(RunRequest(argv=argv, timeout=20, output_chars=20000))


def test_calls_travel_over_the_turns_own_socket(turn, docker_api):
    """The server's end of the channel is a process of the turn's container, and the host folder is gone."""
    channel = turn._channel
    assert isinstance(channel, DirectChannel)
    pid, _, _ = _PEERCRED.unpack(
        channel._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    assert channel.container_id in Path(f"/proc/{pid}/cgroup").read_text()
    assert _run(turn, "echo", "over the socket").output == "over the socket\n"
    binds = docker_api.inspect_container(channel.container_id)["HostConfig"]["Binds"]
    folders = [b.split(":")[0] for b in binds if b.split(":")[1] == CHANNEL_DIR]
    assert len(folders) == 1
    assert not Path(folders[0]).exists()


def test_a_direct_turns_container_has_no_stdin(turn, docker_api):
    """Nothing reads a direct turn's container stdin, so the engine keeps none open for it."""
    config = docker_api.inspect_container(turn._channel.container_id)["Config"]
    assert config["OpenStdin"] is False
    assert config["AttachStdin"] is False
    assert _run(turn, "/bin/sh", "-c", "cat; echo done").output == "done\n"


def test_calls_cannot_see_the_channel(turn):
    """The channel's folder is the server's alone: a call's view has no trace of it."""
    outcome = _run(
        turn, "/bin/sh", "-c", f"ls {CHANNEL_DIR}; grep -c astralvessel-host /proc/self/mountinfo"
    )
    assert "No such file or directory" in outcome.output
    assert outcome.output.rstrip().endswith("0")


def test_a_writable_root_shows_no_channel_and_a_writable_run(backend):
    """With a writable root, whose view binds the image's /run, a call still sees no trace of
    the channel, and /run is the turn's to write (adduser takes its lock there)."""
    policy = Policy(limits=attrs.evolve(SMALL_LIMITS, disk_mb=64), writable_root=True)
    session = backend.start(policy)
    try:
        outcome = _run(
            session,
            "/bin/sh",
            "-c",
            f"ls {CHANNEL_DIR}; grep -c astralvessel-host /proc/self/mountinfo; "
            "touch /run/av-lock && echo locked",
        )
    finally:
        session.close()
    assert "No such file or directory" in outcome.output
    assert outcome.output.rstrip().splitlines()[-2:] == ["0", "locked"], outcome.output


def test_attach_stream_still_serves_turns(docker_api, small_policy):
    """With the direct channel off (a remote engine's case) the turn speaks over the attach stream."""
    backend = Docker(base_image=BASE_IMAGE, pull=False, direct=False)
    session = backend.start(small_policy)
    try:
        assert isinstance(session._channel, AttachChannel)
        assert _run(session, "echo", "over the engine").output == "over the engine\n"
    finally:
        session.close()


def test_a_host_that_refuses_the_socket_falls_back_to_attach(docker_api, monkeypatch):
    """A server that cannot reach the host's socket costs one retry; that turn and later ones use attach."""
    made = []
    original = Listener.__init__

    def unreachable(self: Listener, uid: int) -> None:
        original(self, uid)
        os.chmod(self.folder, 0o700)  # as a host's security policy refusing the container
        made.append(self.folder)

    monkeypatch.setattr(_direct.Listener, "__init__", unreachable)
    backend = Docker(base_image=BASE_IMAGE, pull=False)
    for _ in range(2):
        session = backend.start(Policy(limits=SMALL_LIMITS))
        try:
            assert isinstance(session._channel, AttachChannel)
            assert _run(session, "echo", "fell back").output == "fell back\n"
        finally:
            session.close()
    assert backend.direct is False
    assert len(made) == 1
    assert not Path(made[0]).exists()


def test_an_engine_that_refuses_the_channels_folder_at_create_falls_back_to_attach(
    docker_api, monkeypatch
):
    """An engine that refuses to bind the channel's folder when creating the container (as a
    snap Docker may, its /tmp being its own) costs one retry; that turn and later ones use attach."""
    # A colon in the folder's path is a bind the engine cannot parse: a real refusal at create.
    parent = Path(tempfile.mkdtemp(prefix="av:"))
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    backend = Docker(base_image=BASE_IMAGE, pull=False)
    try:
        for _ in range(2):
            session = backend.start(Policy(limits=SMALL_LIMITS))
            try:
                assert isinstance(session._channel, AttachChannel)
                assert _run(session, "echo", "fell back").output == "fell back\n"
            finally:
                session.close()
        assert backend.direct is False
        assert list(parent.iterdir()) == []
    finally:
        shutil.rmtree(parent)


def test_a_refusal_that_is_not_the_channels_is_the_hosts_error(docker_api, small_policy):
    """A create the engine refuses for the policy's own settings fails on attach too: the
    host gets that refusal, and the backend keeps its direct channel for later turns."""
    backend = Docker(base_image=BASE_IMAGE, pull=False)
    folder = Path(tempfile.mkdtemp(prefix="av:"))  # a bind the engine cannot parse
    folder.chmod(0o755)
    bad = attrs.evolve(small_policy, mounts=(Mount(source=folder, target="/data"),))
    try:
        with pytest.raises(BackendUnavailableError, match="refused to create"):
            backend.start(bad)
    finally:
        folder.rmdir()
    assert backend.direct is True
    session = backend.start(small_policy)
    try:
        assert isinstance(session._channel, DirectChannel)
    finally:
        session.close()


def test_a_long_temporary_folder_keeps_the_direct_channel(docker_api, long_tmp):
    """A host whose temporary folder is longer than a socket's address (107 bytes) still
    gets its turns on the direct channel, and leaves nothing in the folder."""
    backend = Docker(base_image=BASE_IMAGE, pull=False)
    session = backend.start(Policy(limits=SMALL_LIMITS))
    try:
        assert isinstance(session._channel, DirectChannel)
        assert _run(session, "echo", "deep").output == "deep\n"
    finally:
        session.close()
    assert backend.direct is True
    assert list(long_tmp.iterdir()) == []


def _connect_as(uid: int, path: str, said: bytes) -> int:
    """Fork a child that connects to ``path`` as ``uid`` and says ``said``; return once it is in."""
    connected_r, connected_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            sock.sendall(said)
            os.write(connected_w, b"1")
            sock.recv(1)
        finally:
            os._exit(0)
    os.close(connected_w)
    assert os.read(connected_r, 1) == b"1"
    os.close(connected_r)
    return pid


def test_another_uid_is_turned_away():
    """A connection from any uid but the turn's is closed, though it came first; the turn's is accepted."""
    listener = Listener(uid=2013265999)
    ours, theirs = socket.socketpair()
    attach = AttachChannel(None, "none", theirs, engine="test")
    path = os.path.join(listener.folder, CHANNEL_SOCKET)
    pids = [_connect_as(2013265998, path, b"intruder"), _connect_as(2013265999, path, b"server")]
    try:
        conn = listener.accept(attach, timeout=20)
        assert conn.recv(16) == b"server"
        conn.close()
    finally:
        listener.close()
        ours.close()
        theirs.close()
        for pid in pids:
            os.waitpid(pid, 0)
    assert not os.path.exists(listener.folder)


_MAKE_FOLDER_AND_DIE = """
import os, signal, sys
from astralvessel.sandbox.docker._direct import Listener
listener = Listener(uid=2013265999)
print(listener.folder, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_host_folder(tmp: Path) -> Path:
    """Run a host process that makes its channel folder in ``tmp`` and is SIGKILLed; the folder."""
    done = subprocess.run(
        [sys.executable, "-c", _MAKE_FOLDER_AND_DIE],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    return Path(done.stdout.strip())


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path: a unix socket's path must fit in 108 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="av-"))
    yield folder
    shutil.rmtree(folder)


def test_a_killed_hosts_folder_is_reaped_by_the_next_host(short_tmp):
    """A host SIGKILLed before its server connected leaves its folder, and the next host
    process removes it at its first channel."""
    first = _killed_host_folder(short_tmp)
    assert first.is_dir()
    assert (first / CHANNEL_SOCKET).exists()
    second = _killed_host_folder(short_tmp)
    assert not first.exists()
    assert second.is_dir()


def test_reaping_keeps_what_is_not_a_dead_hosts_folder(short_tmp):
    """Reaping removes the dead host's folder only: a live host's folder, a link named as a
    leftover and another uid's folder stay, and so does what the link points to."""
    dead = _killed_host_folder(short_tmp)
    live = short_tmp / (owned_prefix("channel") + "live")
    live.mkdir()
    target = short_tmp / "target"
    target.mkdir()
    link = short_tmp / (dead.name + "L")
    link.symlink_to(target)
    foreign = short_tmp / (dead.name + "F")
    foreign.mkdir()
    os.chown(foreign, 2013265998, 2013265998)
    assert _direct.reap_leftovers(str(short_tmp)) == 1
    assert not dead.exists()
    assert live.is_dir()
    assert target.is_dir()
    assert link.is_symlink()
    assert foreign.is_dir()


def test_leftover_folder_names_are_judged_by_their_owner():
    """Only a well-formed channel folder name whose process is gone (or whose pid was reused) is a leftover."""
    alive = {10: "500"}.get
    assert is_leftover("astralvessel-channel-11-500-abc", "channel", alive)
    assert is_leftover("astralvessel-channel-10-499-abc", "channel", alive)
    assert not is_leftover("astralvessel-channel-10-500-abc", "channel", alive)
    for name in (
        "astralvessel-abc",
        "astralvessel-channel-x-500-abc",
        "astralvessel-channel-11-500",
        "astralvessel-channel--500-abc",
        "other-channel-11-500-abc",
    ):
        assert not is_leftover(name, "channel", alive), name


def test_a_start_refused_while_the_server_is_awaited_is_one_clear_error(docker_api):
    """The host awaits the server while the engine starts its container: a start the engine
    refuses ends that wait at once, as BackendUnavailableError naming the step; nothing is left."""
    backend = Docker(base_image=BASE_IMAGE, pull=False)
    label = "astralvessel-refused-start-test"
    listener = Listener(uid=2013265999)
    spec = container_spec(
        Policy(),
        image=backend.engine.ensure_image(BASE_IMAGE),
        command=["/no/such/program"],
        seccomp_profile={"defaultAction": "SCMP_ACT_ALLOW"},
        labels={LABEL_OWNER: label},
        server=True,
        channel_dir=listener.folder,
    )
    met = []

    def meet(attach: AttachChannel, starting: Starting) -> socket.socket:
        met.append(attach.container_id)
        # Without the start's refusal this would wait for a server that never comes.
        return listener.accept(attach, 600, starting)

    try:
        with pytest.raises(BackendUnavailableError, match="refused to start it") as caught:
            backend.engine.start_meeting(spec, on_close=None, meet=meet)
    finally:
        listener.close()
    assert "/no/such/program" in str(caught.value)
    assert len(met) == 1  # a refusal that is not the runtime's failing is not repeated
    assert docker_api.containers(all=True, filters={"label": f"{LABEL_OWNER}={label}"}) == []
