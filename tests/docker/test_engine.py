"""The Docker backend on a real engine: turns, images, fallback, cleanup and failures."""

from __future__ import annotations

import contextlib
import gc
import marshal
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from astralvessel.agent import Agent
from astralvessel.errors import BackendUnavailableError, SandboxError
from astralvessel.sandbox import DEFAULT_UID_RANGE, Policy, Promise, RunRequest
from astralvessel.sandbox._session import server_command, server_payload
from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.docker._engine import Engine
from astralvessel.sandbox.docker._spec import LABEL_TURN
from astralvessel.sandbox.server import _protocol
from tests.conformance.calls import file_tool

from ..conformance.calls import barrier
from .conftest import BASE_IMAGE, NOPYTHON_IMAGE, SMALL_LIMITS


def _run(session, *argv: str, timeout: float = 20.0, stdin: bytes = b""):
    return session.run(RunRequest(argv=argv, stdin=stdin, timeout=timeout, output_chars=20000))


def _agent_policy(agent: Path) -> Policy:
    """The policy an executor builds for ``agent``: with the Dockerfile Agent.load validated."""
    return Policy(agent_dir=agent, dockerfile=Agent.load(agent).dockerfile, limits=SMALL_LIMITS)


def _exists(api, container_id: str) -> bool:
    import docker

    try:
        api.inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    return True


def test_call_runs_in_the_container(turn):
    """A call runs inside the turn's container, as uid 65534, with the image's ripgrep."""
    outcome = _run(turn, "/bin/sh", "-c", "id -u; rg --version | head -n1; cat /etc/debian_version")
    lines = outcome.output.splitlines()
    assert outcome.exit_code == 0, outcome.output
    assert lines[0] == "65534"
    assert lines[1].startswith("ripgrep")


def test_each_call_is_a_request_to_the_server(turn, docker_api):
    """Calls go to the server in the container, not through docker exec: the engine records no exec."""
    for _ in range(3):
        assert _run(turn, "true").exit_code == 0
    assert not docker_api.inspect_container(turn.channel.container_id).get("ExecIDs")


def test_container_is_removed_when_the_turn_ends(backend, small_policy, docker_api):
    """Closing the turn removes its container."""
    session = backend.start(small_policy)
    container_id = session.channel.container_id
    assert _exists(docker_api, container_id)
    session.close()
    assert not _exists(docker_api, container_id)


def test_container_settings_reach_the_engine(turn, docker_api):
    """The engine holds the turn's lockdown: no network, read-only root, no capabilities, its uid."""
    info = docker_api.inspect_container(turn.channel.container_id)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    # The turn's own host uid and gid, leased from the default range.
    uid, gid = map(int, info["Config"]["User"].split(":"))
    assert uid == gid
    assert DEFAULT_UID_RANGE.first <= uid <= DEFAULT_UID_RANGE.last
    assert info["Config"]["Labels"][LABEL_TURN] == "1"


def test_file_tools_show_the_images_files(backend, agent_with_dockerfile, docker_api):
    """read shows a file that exists only in the image the agent's Dockerfile built, as commands see it."""
    session = backend.start(_agent_policy(agent_with_dockerfile))
    try:
        marker = (agent_with_dockerfile / "sandbox" / "marker.txt").read_text().strip()
        read = file_tool(session, "read", {"path": "/usr/share/vessel-marker.txt"}, timeout=10)
        assert not read.is_error, read.text
        assert marker in read.text
        assert _run(session, "cat", "/usr/share/vessel-marker.txt").output.strip() == marker
        assert not Path("/usr/share/vessel-marker.txt").exists()
    finally:
        session.close()


def test_dockerfile_is_built_once_and_cached(backend, agent_with_dockerfile, docker_api):
    """The agent's Dockerfile is built once; a second turn reuses the image tagged by its content hash."""
    policy = _agent_policy(agent_with_dockerfile)
    first = backend._turn_image(policy)
    created = docker_api.inspect_image(first)["Created"]
    # A fresh backend (no in-process memory) finds the same image by its tag.
    again = Docker(base_image=BASE_IMAGE, pull=False)._turn_image(policy)
    assert again == first
    assert docker_api.inspect_image(again)["Created"] == created
    # Changing the build context makes a new image.
    (agent_with_dockerfile / "sandbox" / "marker.txt").write_text("changed\n")
    assert backend._turn_image(policy) != first


def test_broken_dockerfile_shows_the_build_output(backend, agent_with_dockerfile):
    """A Dockerfile that fails to build raises a clear error that includes the build's output."""
    (agent_with_dockerfile / "sandbox" / "Dockerfile").write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo building-the-broken-step && exit 3\n"
    )
    with pytest.raises(BackendUnavailableError) as caught:
        backend.start(_agent_policy(agent_with_dockerfile))
    message = str(caught.value)
    assert "cannot build the sandbox image" in message
    assert "Dockerfile" in message
    assert "building-the-broken-step" in message


def test_missing_image_is_a_clear_error(docker_api):
    """An image that is neither on the engine nor pullable names itself and how to get it."""
    backend = Docker(base_image="astralvessel-test/does-not-exist:1", pull=False)
    with pytest.raises(BackendUnavailableError, match="does-not-exist"):
        backend.start(Policy())


def test_leftovers_of_a_killed_host_are_removed(docker_api, tmp_path):
    """A host process killed mid-turn leaves a labelled container that the next start removes."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from astralvessel.sandbox import Policy
        from astralvessel.sandbox.docker import Docker
        session = Docker(base_image={BASE_IMAGE!r}, pull=False).start(Policy())
        print(session.channel.container_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    container_id = done.stdout.strip()
    assert container_id, done.stderr
    assert _exists(docker_api, container_id)
    removed = Docker(base_image=BASE_IMAGE, pull=False).sweep()
    assert removed >= 1
    assert not _exists(docker_api, container_id)


def test_killed_host_stops_its_server(docker_api):
    """When the host process dies, the server reads end of input and its container stops by itself."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from astralvessel.sandbox import Policy
        from astralvessel.sandbox.docker import Docker
        session = Docker(base_image={BASE_IMAGE!r}, pull=False).start(Policy())
        print(session.channel.container_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    container_id = done.stdout.strip()
    try:
        status = docker_api.wait(container_id, timeout=30)
        assert "StatusCode" in status
    finally:
        docker_api.remove_container(container_id, force=True)


def test_dead_container_is_a_clear_error(turn, docker_api):
    """A turn whose container was killed reports a SandboxError saying so, instead of hanging."""
    docker_api.kill(turn.channel.container_id)
    with pytest.raises(SandboxError, match="container exited"):
        _run(turn, "sleep", "60", timeout=60)


class _EngineProxy:
    """A unix-socket relay to the real engine that can be cut, as an engine going away is."""

    def __init__(self, path: Path, engine: str = "/var/run/docker.sock") -> None:
        self.path = path
        self.engine = engine
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.engine)
            with self.lock:
                self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                target.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_RDWR)
        # Each socket is the source of exactly one pump, which closes it.
        source.close()

    def cut(self) -> None:
        """Drop every connection and stop listening."""
        # Shut down first: a close alone leaves the accepting thread's call listening.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


# The SDK leaves the socket of a refused connection to the garbage collector.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_engine_going_away_mid_turn_is_a_clear_error(docker_api, tmp_path):
    """On the attach stream, a lost engine connection fails the running call with a SandboxError, not a hang."""
    proxy = _EngineProxy(tmp_path / "engine.sock")
    backend = Docker(
        base_image=BASE_IMAGE, pull=False, base_url=f"unix://{proxy.path}", direct=False
    )
    session = backend.start(Policy())
    container_id = session.channel.container_id
    try:
        assert _run(session, "echo", "up").output.strip() == "up"
        threading.Timer(0.5, proxy.cut).start()
        started = time.monotonic()
        with pytest.raises(SandboxError, match=r"engine|server"):
            _run(session, "sleep", "60", timeout=60)
        assert time.monotonic() - started < 50
    finally:
        session.close()
        docker_api.remove_container(container_id, force=True)
        backend.engine.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del backend, session
            gc.collect()


def test_engine_going_away_leaves_a_direct_turn_working(docker_api, tmp_path):
    """With its own socket a turn outlives a lost engine connection, and its close still ends the container."""
    proxy = _EngineProxy(tmp_path / "engine.sock")
    backend = Docker(base_image=BASE_IMAGE, pull=False, base_url=f"unix://{proxy.path}")
    session = backend.start(Policy())
    container_id = session.channel.container_id
    try:
        assert _run(session, "echo", "up").output.strip() == "up"
        proxy.cut()
        assert _run(session, "echo", "still up").output.strip() == "still up"
        # The engine cannot remove it now; closing the socket ends the server, and so the container.
        session.close()
        assert "StatusCode" in docker_api.wait(container_id, timeout=60)
    finally:
        session.close()
        docker_api.remove_container(container_id, force=True)
        backend.engine.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del backend, session
            gc.collect()


def test_a_local_engine_is_asked_without_reading_the_proxy_environment(backend, monkeypatch):
    """requests reads the proxy variables before each request; a unix socket uses none of them.

    A remote engine's requests still read them: a proxy may stand between.
    """
    import requests.sessions

    looked: list[str] = []
    real = requests.sessions.get_environ_proxies

    def looking(url: str, no_proxy: object = None) -> object:
        looked.append(url)
        return real(url, no_proxy=no_proxy)

    api = backend.engine.api()  # connected first: the SDK asks the version as it connects
    monkeypatch.setattr(requests.sessions, "get_environ_proxies", looking)
    api.inspect_image(BASE_IMAGE)
    assert bool(looked) == (not backend.engine.is_local())


def test_image_without_python_is_refused_naming_docker_exec(docker_api):
    """The docker backend never falls back silently: an image without python3 names docker-exec."""
    backend = Docker(image=NOPYTHON_IMAGE, pull=False)
    with pytest.raises(BackendUnavailableError, match="docker-exec"):
        backend.start(Policy(limits=SMALL_LIMITS).relax(*Promise))


def test_probe_reports_every_promise(backend):
    """doctor's report: available, every promise enforced, the server mode and the engine."""
    report = backend.probe()
    assert report.available, report.reason
    assert report.enforced == frozenset(Promise)
    assert "sandbox server" in report.details["mode"]
    assert "API" in report.details["engine"]


def test_no_engine_is_a_clear_error(tmp_path):
    """With no engine at the address, start says so and how to fix it."""
    backend = Docker(base_url=f"unix://{tmp_path / 'nothing.sock'}")
    with pytest.raises(BackendUnavailableError, match="no Docker engine answers"):
        backend.start(Policy())
    assert not backend.probe().available


def _fds_on(folder: Path) -> list[str]:
    """This process's descriptors open on ``folder``."""
    fds = Path("/proc/self/fd")
    found = []
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):
            if os.readlink(fds / fd) == str(folder):
                found.append(fd)
    return found


def test_an_engine_socket_too_long_for_an_address_is_reached(docker_api, long_tmp, monkeypatch):
    """An engine socket whose path is over the 107 bytes an address holds (a deep DOCKER_HOST
    or XDG_RUNTIME_DIR) is reached all the same; its folder is let go with the client."""
    address = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    assert address.startswith("unix://"), "the test reaches a local engine's socket by a link"
    link = long_tmp / "docker.sock"
    link.symlink_to(address.removeprefix("unix://"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{link}")
    engine = Engine(None, pull=False, start_timeout=20)
    try:
        assert engine.api().ping()
        assert len(_fds_on(long_tmp)) == 1
    finally:
        engine.close()
    assert _fds_on(long_tmp) == []


def test_an_engine_socket_that_cannot_be_shortened_is_a_clear_error(long_tmp):
    """An engine socket whose name alone leaves no room in an address is the host's error,
    naming the path and the fix."""
    path = long_tmp / ("n" * 100)
    with pytest.raises(BackendUnavailableError, match="point DOCKER_HOST at a shorter path") as e:
        Docker(base_url=f"unix://{path}").start(Policy())
    assert str(path) in str(e.value)


def test_calls_of_a_turn_run_concurrently(turn):
    """Two calls of one turn are in flight at once in the server: each waits for the other to start."""
    results: list[str] = []

    def call(name: str) -> None:
        script = barrier("$TMPDIR", name, 2)
        results.append(_run(turn, "/bin/sh", "-c", script, timeout=60).output.strip())

    threads = [threading.Thread(target=call, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Serialised calls would leave the first one waiting alone until it gave up.
    assert results == ["met", "met"]


def test_host_environment_does_not_leak(turn, monkeypatch):
    """A variable of the host process never reaches a call."""
    os.environ["VESSEL_HOST_ONLY"] = "secret"
    try:
        assert "VESSEL_HOST_ONLY" not in _run(turn, "env").output
    finally:
        del os.environ["VESSEL_HOST_ONLY"]


def test_the_image_compiles_the_server_once_and_turns_load_that_code(backend, small_policy):
    """The image's own Python compiles the server's modules once; a turn's server loads that code."""
    session = backend.start(small_policy)
    try:
        image_id = backend.engine.ensure_image(backend.base_image)
        build = backend.engine.server_build(image_id, backend.python)
        assert build is not None
        major, minor, micro = (int(part) for part in session.ready_info["python"].split(".")[:3])
        assert build.hexversion >> 8 == (major << 16 | minor << 8 | micro)
    finally:
        session.close()
    # The same build, with every module's source broken: the image's server still boots.
    payload = marshal.loads(server_payload(build))  # noqa: S302 - our own payload
    payload["src"] = dict.fromkeys(payload["src"], "raise SystemExit('compiled source')")
    data = marshal.dumps(payload, 4)
    argv = [*server_command(backend.python, build)[:-1], str(len(data))]
    done = subprocess.run(
        ["docker", "run", "--rm", "-i", "--network", "none", BASE_IMAGE, *argv],
        input=data + _protocol.encode({"type": "run", "id": 1}),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert b"expected 'hello' first" in done.stdout, done.stderr
    assert b"compiled source" not in done.stderr


def test_an_image_found_to_run_python_is_not_probed_again_by_another_engine(backend, tmp_path):
    """Which image runs the server's Python, and its compiled server, hold for the process:
    a second ``Docker()`` starts no throwaway to ask again (it could not: no engine answers it)."""
    image_id = backend.engine.ensure_image(backend.base_image)
    assert backend.engine.has_python(image_id, backend.python)
    build = backend.engine.server_build(image_id, backend.python)
    assert build is not None
    unreachable = Engine(f"unix://{tmp_path / 'nothing.sock'}", pull=False, start_timeout=5.0)
    assert unreachable.has_python(image_id, backend.python)
    assert unreachable.server_build(image_id, backend.python) == build
    # An image this process never found to run Python is asked of the engine, which is not there.
    with pytest.raises(BackendUnavailableError, match="no Docker engine answers"):
        unreachable.has_python("sha256:" + "0" * 64, backend.python)
