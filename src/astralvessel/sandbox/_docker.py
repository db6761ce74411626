"""The Docker backend: one container per turn on a real engine, through the Docker SDK.

The container's own process is the sandbox server, run on the image's
``python3`` and reached over the engine's attach stream (so each call is a
request to the server, not a ``docker exec``). Settings come from pure
functions in ``_docker_spec``; this module is the thin shell that talks to the
engine: images (base, or an agent's Dockerfile built once per content hash),
the attach channel, leftover cleanup, and the exec-per-call fallback for
images without a usable Python. See ``docs/docker.md``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import platform
import socket
import struct
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..errors import BackendUnavailableError, PromiseNotEnforcedError, SandboxError
from ._base import (
    BackendReport,
    FileOutcome,
    RunOutcome,
    RunRequest,
    Sandbox,
    SandboxSession,
    ServerLink,
    ServerOptions,
)
from ._docker_spec import (
    CALL_UID,
    DEFAULT_BASE_IMAGE,
    LABEL_MODE,
    LABEL_OWNER,
    LABEL_POLICY,
    LABEL_TURN,
    ContainerSpec,
    container_spec,
    context_digest,
    exec_argv,
    is_leftover,
    owner_label,
    server_argv,
)
from ._policy import Policy, Promise

__all__ = ["DEFAULT_BASE_IMAGE", "Docker"]

#: Overrides the default base image for hosts that cannot pull (CI builds one offline).
BASE_IMAGE_ENV = "ASTRALVESSEL_DOCKER_IMAGE"
#: Tag prefix of images built from an agent's Dockerfile.
BUILT_REPOSITORY = "astralvessel-agent"
#: Oldest Python the server runs on.
MIN_PYTHON = (3, 8)
_STDERR_TAIL = 16 * 1024
_FALLBACK_NOTE = (
    "the image has no usable python3 (3.8+), so each call is one `docker exec` with the same "
    "limits; calls of one turn run one at a time and the file tools are unavailable"
)
#: What a fallback call's result says about how it ran.
FALLBACK_METADATA = {"docker_mode": "exec-per-call", "docker_note": _FALLBACK_NOTE}


def _import_docker() -> Any:
    try:
        import docker
    except ImportError:
        raise BackendUnavailableError(
            "the docker backend needs the Docker SDK: pip install 'astralvessel[docker]'"
        ) from None
    return docker


def _process_start_time(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot), or ``None`` if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields resume after the last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def _raw_socket(attached: Any) -> Any:
    """The socket under the SDK's attach object (a ``SocketIO`` locally, a channel over SSH)."""
    return getattr(attached, "_sock", attached)


class AttachChannel:
    """A ``Channel`` over a container's attach stream: stdin in, demultiplexed stdout out.

    Without a TTY the engine frames each chunk with an 8-byte header naming the
    stream; stdout frames carry the server's protocol, stderr frames are kept
    as a bounded tail for ``describe_exit``.
    """

    def __init__(self, api: Any, container_id: str, attached: Any, *, engine: str) -> None:
        self._api = api
        #: The turn's container.
        self.container_id = container_id
        self._id = container_id
        self._sock = _raw_socket(attached)
        self._attached = attached
        self._engine = engine
        self._pending = bytearray()
        self._stdout = bytearray()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._closed = False
        self._lock = threading.Lock()
        self._exit: str | None = None

    def send(self, data: bytes) -> None:
        """Write to the server's stdin."""
        self._sock.sendall(data)

    def recv(self, size: int) -> bytes:
        """Return up to ``size`` bytes of the server's stdout; ``b""`` only at end of stream."""
        while not self._stdout:
            if not self._fill():
                return b""
        data = bytes(self._stdout[:size])
        del self._stdout[:size]
        return data

    def _fill(self) -> bool:
        """Read one frame's worth; False at end of stream."""
        while True:
            if len(self._pending) >= 8:
                kind, length = struct.unpack_from(">BxxxI", self._pending)
                if len(self._pending) >= 8 + length:
                    payload = bytes(self._pending[8 : 8 + length])
                    del self._pending[: 8 + length]
                    if kind == 1:
                        self._stdout += payload
                        return True
                    self._keep_stderr(payload)
                    continue
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                if self._closed:
                    return False
                raise
            if not chunk:
                return False
            self._pending += chunk

    def _keep_stderr(self, payload: bytes) -> None:
        self._tail.append(payload)
        self._tail_size += len(payload)
        while self._tail_size > _STDERR_TAIL and len(self._tail) > 1:
            self._tail_size -= len(self._tail.popleft())

    def close(self) -> None:
        """Remove the container (killing everything in it) and close the stream. Never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._exit = self._exit_status()
        with contextlib.suppress(Exception):
            self._api.remove_container(self._id, force=True)
        with contextlib.suppress(Exception):
            self._sock.shutdown(socket.SHUT_RDWR)
        _release_response(self._attached)
        with contextlib.suppress(Exception):
            self._attached.close()
        with contextlib.suppress(Exception):
            self._sock.close()

    def _exit_status(self) -> str:
        try:
            state = self._api.inspect_container(self._id)["State"]
        except Exception as exc:
            return f"the Docker engine ({self._engine}) did not answer: {exc}"
        if state.get("Running"):
            return "the container was still running"
        parts = [f"the container exited with status {state.get('ExitCode')}"]
        if state.get("OOMKilled"):
            parts.append("killed for using more memory than its limit")
        if state.get("Error"):
            parts.append(f"engine error: {state['Error']}")
        return ", ".join(parts)

    def describe_exit(self) -> str:
        """Why the sandbox ended: the container's state and the server's stderr tail."""
        status = self._exit or self._exit_status()
        tail = b"".join(self._tail).decode("utf-8", "replace").strip()
        return f"{status}; stderr: {tail[-2000:]}" if tail else status


class Docker(Sandbox):
    """Run each turn in its own container on a Docker (or Podman) engine.

    ``base_image`` is the image used when neither ``image`` nor a Dockerfile
    is given (default ``python:3.12-slim``, or ``$ASTRALVESSEL_DOCKER_IMAGE``).
    ``image`` forces one image for every turn. ``dockerfile`` is built once,
    with ``BASE_IMAGE`` as a build argument, and cached by the content hash of
    its folder; without it an agent's ``[sandbox] dockerfile`` is used.
    ``base_url`` names the engine (else ``DOCKER_HOST`` and the current
    context, as the ``docker`` CLI does). ``pull`` lets a missing image be
    pulled. ``cpus`` caps each turn's CPU share.
    """

    name: ClassVar[str] = "docker"

    def __init__(
        self,
        *,
        base_image: str | None = None,
        image: str | None = None,
        dockerfile: str | os.PathLike[str] | None = None,
        base_url: str | None = None,
        python: str = "python3",
        pull: bool = True,
        cpus: float | None = 1.0,
        start_timeout: float = 60.0,
    ) -> None:
        self.base_image = base_image or os.environ.get(BASE_IMAGE_ENV) or DEFAULT_BASE_IMAGE
        self.image = image
        self.dockerfile = None if dockerfile is None else Path(dockerfile).resolve()
        self.base_url = base_url
        self.python = python
        self.pull = pull
        self.cpus = cpus
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._client: Any = None
        self._python_ok: dict[str, bool] = {}
        self._built: dict[Path, str] = {}
        self._swept = False

    def __repr__(self) -> str:
        return (
            f"Docker(base_image={self.base_image!r})"
            if self.image is None
            else f"Docker(image={self.image!r})"
        )

    # -- engine -------------------------------------------------------------------

    def _api(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
                # Close the engine connections when this backend is collected, not at exit.
                weakref.finalize(self, self._client.close)
            return self._client.api

    def _connect(self) -> Any:
        docker = _import_docker()
        failure = ""
        try:
            if self.base_url is not None:
                client = docker.DockerClient(base_url=self.base_url, version="auto")
            else:
                client = _client_from_context(docker)
            client.ping()
        except Exception as exc:
            failure = str(exc)
        else:
            return client
        # The SDK drops the socket of a refused connection without closing it; with the
        # exception (and its frames) gone, reap it now, quietly, not at a later collection.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        raise BackendUnavailableError(
            f"docker cannot start: no Docker engine answers ({failure}); start dockerd "
            "(or Podman's Docker-compatible socket) or set DOCKER_HOST"
        )

    # -- images -------------------------------------------------------------------

    def _ensure_image(self, name: str) -> str:
        """Return the id of image ``name``, pulling it if allowed; raise if it cannot be had."""
        api = self._api()
        docker = _import_docker()
        try:
            return str(api.inspect_image(name)["Id"])
        except docker.errors.ImageNotFound:
            pass
        if self.pull:
            try:
                api.pull(name)
                return str(api.inspect_image(name)["Id"])
            except docker.errors.APIError as exc:
                reason = f"it is not on the engine and pulling it failed ({exc.explanation or exc})"
        else:
            reason = "it is not on the engine and pulling is off"
        raise BackendUnavailableError(
            f"docker cannot start: image {name!r} is unavailable: {reason}. Build or load it "
            f"(see docs/docker.md, 'Offline images') or choose another with Docker(base_image=...) "
            f"or ${BASE_IMAGE_ENV}"
        )

    def _dockerfile_for(self, policy: Policy) -> Path | None:
        if self.dockerfile is not None:
            return self.dockerfile
        if policy.agent_dir is None:
            return None
        return agent_dockerfile(policy.agent_dir)

    def _turn_image(self, policy: Policy) -> str:
        """The image id for a turn: forced image, built Dockerfile, or the base image."""
        if self.image is not None:
            return self._ensure_image(self.image)
        dockerfile = self._dockerfile_for(policy)
        base_id = self._ensure_image(self.base_image)
        if dockerfile is None:
            return base_id
        return self._build(dockerfile, base_id)

    def _build(self, dockerfile: Path, base_id: str) -> str:
        """Build ``dockerfile`` once per content of its folder; reuse the tagged image after."""
        context = dockerfile.parent
        digest = context_digest(
            _context_files(context), dockerfile=dockerfile.name, base_image_id=base_id
        )
        tag = f"{BUILT_REPOSITORY}:{digest}"
        api = self._api()
        docker = _import_docker()
        with contextlib.suppress(docker.errors.ImageNotFound):
            return str(api.inspect_image(tag)["Id"])
        log: list[str] = []
        error = ""
        try:
            for chunk in api.build(
                path=str(context),
                dockerfile=dockerfile.name,
                tag=tag,
                buildargs={"BASE_IMAGE": self.base_image},
                rm=True,
                forcerm=True,
                decode=True,
                labels={"org.astralvessel.context": digest},
            ):
                if "stream" in chunk:
                    log.append(str(chunk["stream"]))
                if "error" in chunk:
                    error = str(chunk["error"]).strip()
        except docker.errors.APIError as exc:
            error = str(exc.explanation or exc)
        if not error:
            with contextlib.suppress(docker.errors.ImageNotFound):
                return str(api.inspect_image(tag)["Id"])
            error = "the build finished without producing the image"
        output = "".join(log).strip()
        raise BackendUnavailableError(
            f"docker cannot build the sandbox image from {dockerfile}: {error}\n"
            f"--- build output ---\n{output[-8000:]}"
        )

    def _has_python(self, image_id: str) -> bool:
        """Whether ``image_id`` runs ``python3`` 3.8+ (checked once per image, in a throwaway)."""
        with self._lock:
            known = self._python_ok.get(image_id)
        if known is not None:
            return known
        api = self._api()
        check = "import sys; sys.exit(0 if sys.version_info >= (3, 8) else 3)"
        container = api.create_container(
            image_id,
            command=[self.python, "-I", "-S", "-c", check],
            user=f"{CALL_UID}:{CALL_UID}",
            labels={LABEL_TURN: "probe", LABEL_OWNER: _owner()},
            host_config=api.create_host_config(
                network_mode="none", read_only=True, cap_drop=["ALL"]
            ),
        )
        try:
            with contextlib.suppress(Exception):
                api.start(container)
            status = api.wait(container, timeout=self.start_timeout).get("StatusCode", 1)
        except Exception:
            status = 1
        finally:
            with contextlib.suppress(Exception):
                api.remove_container(container, force=True)
        ok = bool(status == 0)
        with self._lock:
            self._python_ok[image_id] = ok
        return ok

    # -- leftovers -----------------------------------------------------------------

    def sweep(self) -> int:
        """Remove containers of turns whose host process died; return how many were removed."""
        api = self._api()
        hostname = socket.gethostname()
        removed = 0
        for summary in api.containers(all=True, filters={"label": LABEL_TURN}):
            labels = summary.get("Labels") or {}
            if is_leftover(labels, hostname, _process_start_time):
                with contextlib.suppress(Exception):
                    api.remove_container(summary["Id"], force=True)
                    removed += 1
        return removed

    def _sweep_once(self) -> None:
        with self._lock:
            if self._swept:
                return
            self._swept = True
        with contextlib.suppress(Exception):
            self.sweep()

    # -- the Sandbox contract ---------------------------------------------------------

    def probe(self) -> BackendReport:
        """Say whether an engine answers and, by starting a trial turn, which promises it keeps."""
        try:
            api = self._api()
            version = api.version()
        except BackendUnavailableError as exc:
            return BackendReport(name=self.name, available=False, reason=str(exc))
        except Exception as exc:
            return BackendReport(name=self.name, available=False, reason=f"probing failed: {exc}")
        details = {
            "engine": (
                f"{version.get('Version', '?')} (API {version.get('ApiVersion', '?')}) "
                f"at {api.base_url}"
            ),
            "image": self.image or self.base_image,
            "user": f"uid {CALL_UID} in a user namespace of its own, no capabilities",
        }
        policy = Policy()
        try:
            session = self.start(policy.relax(*Promise))
        except Exception as exc:
            return BackendReport(
                name=self.name,
                available=False,
                reason=f"a trial turn failed: {exc}",
                details=details,
            )
        try:
            unenforced = dict(session.unenforced())
            fallback = isinstance(session, ExecSession)
        finally:
            session.close()
        details["mode"] = (
            f"fallback: {_FALLBACK_NOTE}" if fallback else "sandbox server in the container"
        )
        return BackendReport(
            name=self.name,
            available=True,
            binary=None,
            enforced=frozenset(p for p in Promise if p not in unenforced),
            unenforced=unenforced,
            details=details,
        )

    def _prepare(self, policy: Policy) -> tuple[str, Any]:
        """The turn's image id and seccomp architecture; fail closed without a filter."""
        from . import _seccomp

        self._api()
        self._sweep_once()
        arch = _seccomp.available_arch()
        if arch is None and Promise.SECCOMP not in policy.relaxed:
            raise PromiseNotEnforcedError(
                self.name,
                Promise.SECCOMP.value,
                f"no seccomp filter is built for {platform.machine()}",
            )
        return self._turn_image(policy), arch

    def start(self, policy: Policy) -> SandboxSession:
        """Start one turn's container with the server in it; fail closed on any promise not kept."""
        image_id, arch = self._prepare(policy)
        if self._has_python(image_id):
            return super().start(policy)
        return self._start_fallback(policy, image_id, arch)

    def open(self, policy: Policy) -> ServerLink:
        """Start one turn's container with the server as its process; return the attach channel."""
        image_id, arch = self._prepare(policy)
        if not self._has_python(image_id):
            raise BackendUnavailableError(
                f"docker cannot run the sandbox server: image {image_id} has no python3 3.8+"
            )
        return self._open_server(policy, image_id, arch)

    def _labels(self, policy: Policy, mode: str) -> dict[str, str]:
        return {
            LABEL_TURN: "1",
            LABEL_OWNER: _owner(),
            LABEL_MODE: mode,
            LABEL_POLICY: policy.identity,
        }

    def _create(self, spec: ContainerSpec) -> str:
        api = self._api()
        host_config = api.create_host_config(**_sdk_host_config(spec.host_config))
        host_config.update(spec.host_config_extra)
        created = api.create_container(
            spec.image,
            # The entrypoint too, so an image's own ENTRYPOINT never wraps the server.
            entrypoint=list(spec.command[:1]),
            command=list(spec.command[1:]),
            user=spec.user,
            environment=dict(spec.environment),
            working_dir=spec.working_dir,
            labels=dict(spec.labels),
            host_config=host_config,
            # Open stdin that closes when our attach stream does (StdinOnce): a killed host's
            # server reads end of input and exits, and its container stops.
            stdin_open=True,
            hostname="sandbox",
            # The client's proxy settings would add variables to the clean environment.
            use_config_proxy=False,
        )
        return str(created["Id"])

    def _attach_and_start(self, container_id: str) -> AttachChannel:
        api = self._api()
        try:
            attached = api.attach_socket(
                container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            channel = AttachChannel(api, container_id, attached, engine=str(api.base_url))
            _raw_socket(attached).settimeout(None)
            api.start(container_id)
        except Exception as exc:
            with contextlib.suppress(Exception):
                api.remove_container(container_id, force=True)
            raise SandboxError(
                f"the docker engine could not start the turn's container: {exc}"
            ) from None
        return channel

    def _open_server(self, policy: Policy, image_id: str, arch: Any) -> ServerLink:
        from . import _seccomp
        from ._session import server_command

        profile = (
            _seccomp.to_docker_profile("server", arch)
            if arch
            else {"defaultAction": "SCMP_ACT_ALLOW"}
        )
        spec = container_spec(
            policy,
            image=image_id,
            command=server_argv(server_command(self.python), policy),
            seccomp_profile=profile,
            labels=self._labels(policy, "server"),
            server=True,
            cpus=self.cpus,
        )
        container_id = self._create(spec)
        channel = self._attach_and_start(container_id)
        return ServerLink(
            channel=channel,
            options=ServerOptions(
                confine=True,
                # The container already runs as uid 65534; in its user namespace only that uid
                # exists, so there is nothing to drop to: a call loses its capabilities at exec.
                seccomp=_seccomp.compile_bpf("calls", arch) if arch else None,
                ready_timeout=self.start_timeout,
            ),
        )

    def _start_fallback(self, policy: Policy, image_id: str, arch: Any) -> SandboxSession:
        from . import _seccomp

        if Promise.PROCESS_ISOLATION not in policy.relaxed:
            # Every exec joins the container's PID namespace, where its idle first process
            # is visible (not signalable: another uid). Fail closed unless the host accepts that.
            raise PromiseNotEnforcedError(
                self.name,
                Promise.PROCESS_ISOLATION.value,
                f"{_FALLBACK_NOTE}, and every call can see the container's idle first process. "
                "Use an image with python3 3.8+ to run the sandbox server",
            )

        profile = (
            _seccomp.to_docker_profile("calls", arch)
            if arch
            else {"defaultAction": "SCMP_ACT_ALLOW"}
        )
        spec = container_spec(
            policy,
            image=image_id,
            # An idle shell holds the container open until the host's attach stream closes.
            command=["/bin/sh", "-c", "read _ignored"],
            seccomp_profile=profile,
            labels=self._labels(policy, "exec"),
            server=False,
            cpus=self.cpus,
        )
        container_id = self._create(spec)
        channel = self._attach_and_start(container_id)
        session = ExecSession(self._api(), container_id, channel, policy, backend=self.name)
        try:
            session.prepare()
        except BaseException:
            session.close()
            raise
        return session


class ExecSession(SandboxSession):
    """The fallback: each call is one ``docker exec`` as uid 65534 in the turn's container.

    The container carries every limit and the ``calls`` seccomp profile, so an
    exec gets them too. Calls run one at a time, and after each one every
    process of the call user is killed, which is how a call's leftovers go.
    """

    def __init__(
        self, api: Any, container_id: str, channel: AttachChannel, policy: Policy, *, backend: str
    ) -> None:
        self.policy = policy
        self.backend = backend
        self.container_id = container_id
        self._api = api
        self._channel = channel
        self._call_lock = threading.Lock()
        self._closed = False
        self._outbox_root = Path(tempfile.mkdtemp(prefix="astralvessel-docker-outbox-"))

    def _exec(self, argv: list[str], *, user: str) -> tuple[int | None, bytes]:
        """Run a short helper command in the container and return its exit code and stdout."""
        exec_id = self._api.exec_create(self.container_id, argv, user=user, workdir="/")["Id"]
        attached = self._api.exec_start(exec_id, socket=True)
        sock = _raw_socket(attached)
        output = bytearray()
        try:
            for kind, payload in _frames(sock):
                if kind == 1:
                    output += payload
        finally:
            _close_attached(attached)
        return self._api.exec_inspect(exec_id).get("ExitCode"), bytes(output)

    def prepare(self) -> None:
        """Create the outbox in the workspace."""
        code, out = self._exec(
            ["mkdir", "-p", str(self.policy.environment["VESSEL_OUTBOX"])], user=f"{CALL_UID}"
        )
        if code != 0:
            raise SandboxError(
                "the docker fallback container cannot prepare its workspace: "
                + out.decode(errors="replace")
            )

    def _kill_calls(self) -> None:
        # `kill -9 -1` as the call user reaches every process of that uid and nothing else.
        with contextlib.suppress(Exception):
            self._exec(["/bin/sh", "-c", "kill -9 -1"], user=f"{CALL_UID}:{CALL_UID}")

    def run(self, request: RunRequest) -> RunOutcome:
        """Run one call as a ``docker exec`` and wait for it (one at a time)."""
        with self._call_lock:
            if self._closed:
                raise SandboxError("the docker turn is closed")
            return self._run_locked(request)

    def _run_locked(self, request: RunRequest) -> RunOutcome:
        api = self._api
        started = time.monotonic()
        try:
            exec_id = api.exec_create(
                self.container_id,
                exec_argv(self.policy, request.argv),
                user=f"{CALL_UID}:{CALL_UID}",
                workdir=request.cwd or str(self.policy.workdir),
                stdin=True,
            )["Id"]
            attached = api.exec_start(exec_id, socket=True)
        except Exception as exc:
            raise SandboxError(
                f"docker exec failed: {exc}; {self._channel.describe_exit()}"
            ) from None
        try:
            output, timed_out = self._stream(
                _raw_socket(attached), request, started + request.timeout
            )
        finally:
            _close_attached(attached)
        self._kill_calls()
        try:
            exit_code = None if timed_out else api.exec_inspect(exec_id).get("ExitCode")
        except Exception as exc:
            raise SandboxError(
                f"the docker engine lost the call ({exc}); {self._channel.describe_exit()}"
            ) from None
        return RunOutcome(
            output=output.text,
            exit_code=exit_code,
            timed_out=timed_out,
            dropped_chars=output.dropped,
            files=self._collect_outbox(),
            duration=time.monotonic() - started,
            # The host learns the call ran in the fallback; the model never sees this.
            metadata=dict(FALLBACK_METADATA),
        )

    def _stream(self, sock: Any, request: RunRequest, deadline: float) -> tuple[_Output, bool]:
        """Feed stdin, collect bounded output until the exec ends or the deadline passes."""

        def feed() -> None:
            with contextlib.suppress(OSError):
                sock.sendall(request.stdin)
                sock.shutdown(socket.SHUT_WR)

        threading.Thread(target=feed, daemon=True).start()
        output = _Output(request.output_chars)
        frames = _frames(sock, deadline=deadline)
        for kind, payload in frames:
            if kind == _TIMED_OUT:
                self._kill_calls()
                return output, True
            output.add(payload)
        return output, False

    def _collect_outbox(self) -> tuple[Any, ...]:
        from ._base import OutboxFile

        outbox = str(self.policy.environment["VESSEL_OUTBOX"])
        code, listing = self._exec(
            [
                "/bin/sh",
                "-c",
                f'cd {outbox} && for f in * .*; do [ -f "$f" ] && printf "%s\\0" "$f"; done; true',
            ],
            user=f"{CALL_UID}",
        )
        names = [n for n in listing.decode("utf-8", "replace").split("\0") if n]
        if code != 0 or not names:
            return ()
        folder = Path(tempfile.mkdtemp(dir=self._outbox_root))
        files = []
        for name in sorted(names):
            code, data = self._exec(["cat", f"{outbox}/{name}"], user=f"{CALL_UID}")
            if code != 0:
                continue
            path = folder / name
            path.write_bytes(data)
            files.append(OutboxFile(name=name, size=len(data), path=path))
            self._exec(["rm", "-f", f"{outbox}/{name}"], user=f"{CALL_UID}")
        return tuple(files)

    async def arun(self, request: RunRequest) -> RunOutcome:
        """Async twin of ``run``."""
        return await asyncio.to_thread(self.run, request)

    def file_tool(
        self, tool: str, arguments: Mapping[str, object], *, timeout: float
    ) -> FileOutcome:
        """File tools need the server, which needs Python in the image; say so to the model."""
        return FileOutcome(
            text=f"{tool} is unavailable in this sandbox: its image has no python3, which the file "
            "tools need; use bash (cat, ls, find) instead",
            is_error=True,
        )

    async def afile_tool(
        self, tool: str, arguments: Mapping[str, object], *, timeout: float
    ) -> FileOutcome:
        """Async twin of ``file_tool``."""
        return self.file_tool(tool, arguments, timeout=timeout)

    def unenforced(self) -> Mapping[Promise, str]:
        """The fallback joins the container's PID namespace: process isolation is not kept."""
        return {Promise.PROCESS_ISOLATION: "fallback mode: " + _FALLBACK_NOTE}

    def close(self) -> None:
        """Remove the container and the host's outbox copies. Never raises."""
        self._closed = True
        self._channel.close()
        import shutil

        shutil.rmtree(self._outbox_root, ignore_errors=True)


#: A pseudo stream number ``_frames`` yields when its deadline passes.
_TIMED_OUT = -1


def _frames(sock: Any, *, deadline: float | None = None) -> Iterator[tuple[int, bytes]]:
    """The engine's multiplexed frames (stream number, payload) until end of stream or deadline."""
    pending = bytearray()
    while True:
        while len(pending) >= 8:
            kind, length = struct.unpack_from(">BxxxI", pending)
            if len(pending) < 8 + length:
                break
            payload = bytes(pending[8 : 8 + length])
            del pending[: 8 + length]
            yield kind, payload
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                yield _TIMED_OUT, b""
                return
            sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return
        if not chunk:
            return
        pending += chunk


class _Output:
    """A call's combined output, kept up to ``limit`` characters and counted beyond."""

    def __init__(self, limit: int) -> None:
        from .server import _protocol

        self._protocol = _protocol
        self.limit = limit
        self.kept = bytearray()
        self.kept_chars = 0
        self.dropped = 0

    def add(self, payload: bytes) -> None:
        room = self.limit - self.kept_chars
        index = self._protocol.split_chars(payload, room) if room > 0 else 0
        self.kept += payload[:index]
        self.kept_chars += self._protocol.count_chars(payload[:index])
        self.dropped += self._protocol.count_chars(payload[index:])

    @property
    def text(self) -> str:
        return self.kept.decode("utf-8", "replace")


def _close_attached(attached: Any) -> None:
    """Close an attach or exec stream: the SDK's wrapper and the socket under it."""
    sock = _raw_socket(attached)
    _release_response(attached)
    with contextlib.suppress(Exception):
        attached.close()
    with contextlib.suppress(Exception):
        sock.close()


def _release_response(attached: Any) -> None:
    """Close the HTTP response the SDK keeps alive on an attach socket (``_response``).

    Closed only with the socket under it, that response's finalizer later flushes a
    closed file, which Python 3.13 reports as an unraisable ``ValueError``.
    """
    response = getattr(attached, "_response", None) or getattr(
        _raw_socket(attached), "_response", None
    )
    if response is not None:
        with contextlib.suppress(Exception):
            response.close()


def _owner() -> str:
    pid = os.getpid()
    return owner_label(socket.gethostname(), pid, _process_start_time(pid) or "?")


def _client_from_context(docker: Any) -> Any:
    """A client for ``DOCKER_HOST``, else the CLI's current context, else the local socket."""
    if os.environ.get("DOCKER_HOST"):
        return docker.from_env(version="auto")
    with contextlib.suppress(Exception):
        from docker.context import ContextAPI

        context = ContextAPI.get_current_context()
        if context is not None and context.name != "default" and context.Host:
            return docker.DockerClient(
                base_url=context.Host,
                tls=context.TLSConfig or False,
                version="auto",
                use_ssh_client=False,
            )
    for candidate in _podman_sockets():
        if not Path("/var/run/docker.sock").exists() and Path(candidate).exists():
            return docker.DockerClient(base_url=f"unix://{candidate}", version="auto")
    return docker.from_env(version="auto")


def _podman_sockets() -> Iterator[str]:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        yield f"{runtime}/podman/podman.sock"
    yield "/run/podman/podman.sock"


def _sdk_host_config(values: Mapping[str, object]) -> dict[str, object]:
    """Turn the spec's plain values into the SDK's argument types."""
    docker = _import_docker()
    out = dict(values)
    ulimits: Any = out.pop("ulimits", [])
    out["ulimits"] = [
        docker.types.Ulimit(name=u["Name"], soft=u["Soft"], hard=u["Hard"]) for u in ulimits
    ]
    log = out.pop("log_config", None)
    if isinstance(log, dict):
        out["log_config"] = docker.types.LogConfig(type=log["Type"], config=log["Config"])
    return out


def _context_files(context: Path) -> list[tuple[str, int, bytes]]:
    files: list[tuple[str, int, bytes]] = []
    for path in sorted(context.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files.append(
                (
                    path.relative_to(context).as_posix(),
                    path.stat().st_mode & 0o777,
                    path.read_bytes(),
                )
            )
    return files


def agent_dockerfile(agent_dir: Path) -> Path | None:
    """The agent's ``[sandbox] dockerfile``, resolved inside its folder, if it names one."""
    try:
        data = tomllib.loads((agent_dir / "vessel.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = (
        data.get("sandbox", {}).get("dockerfile") if isinstance(data.get("sandbox"), dict) else None
    )
    if not isinstance(name, str):
        return None
    path = (agent_dir / name).resolve()
    if agent_dir.resolve() not in path.parents or not path.is_file():
        return None
    return path
