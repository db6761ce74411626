"""The engine: a client found the way the ``docker`` CLI finds one, images, containers.

``Engine`` is the thin shell over the Docker SDK that both Docker backends
share: it connects once (``DOCKER_HOST``, the current context, the local
socket, else Podman's), makes sure an image is there (pulling only if
allowed), builds an agent's Dockerfile once per content hash, checks once per
image whether it has a usable ``python3``, creates, attaches to and starts a
turn's container, and sweeps the containers of dead hosts. What a container
looks like is decided in ``_spec``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..._ground._leftovers import start_time as process_start_time
from ..._ground._suggest import install_extra
from ...errors import AstralVesselError, BackendUnavailableError
from .._layout import HOSTNAME
from .._session import ServerBuild, compile_command, parse_build
from ._address import EngineAddresses
from ._attach import AttachChannel, close_attached, raw_socket
from ._gate import GatedApi, gate_for, resolve_concurrency, resolve_scope, status_of
from ._no_engine import engine_socket, no_engine_message, socket_facts
from ._spec import (
    CALL_UID,
    LABEL_OWNER,
    LABEL_TURN,
    ContainerSpec,
    context_digest,
    is_leftover,
    owner_label,
)
from ._starting import EngineRefused, Starting, start_failure

__all__ = [
    "BASE_IMAGE_ENV",
    "BUILT_REPOSITORY",
    "CreateRefusedError",
    "Engine",
    "import_docker",
    "owner",
    "process_start_time",
]

#: Overrides the default base image for hosts that cannot pull (CI builds one offline).
BASE_IMAGE_ENV = "ASTRALVESSEL_DOCKER_IMAGE"
#: Tag prefix of images built from an agent's Dockerfile.
BUILT_REPOSITORY = "astralvessel-agent"

#: Images every engine of this process found to run the server's Python, with the server's
#: modules each compiled (``Engine.has_python``), by (image id, python). An image's id is the
#: digest of its content, so a yes holds on any engine and for the process's life: a host that
#: makes a ``Docker()`` per executor no longer starts a throwaway container per instance (1.8 s
#: of a 3 s first turn at load 10). A no, or a yes without the code (the engine failed to hand
#: the logs over), stays with the engine that said it: its runtime may be what failed.
_PYTHON_IMAGES: dict[tuple[str, str], ServerBuild] = {}
_PYTHON_IMAGES_LOCK = threading.Lock()
#: The SDK's base URL for an engine on a local unix socket.
_LOCAL_URL = "http+docker://localhost"


def import_docker() -> Any:
    """The Docker SDK, or ``BackendUnavailableError`` saying how to install it."""
    try:
        import docker
    except ImportError:
        raise BackendUnavailableError(
            f"the docker backend needs the Docker SDK: {install_extra('docker')}"
        ) from None
    return docker


class Engine:
    """One connection to a Docker (or Podman) engine, opened on first use, with its caches."""

    def __init__(
        self,
        base_url: str | None,
        *,
        pull: bool,
        start_timeout: float,
        concurrency: int | None = None,
        scope: str | None = None,
    ) -> None:
        self.base_url = base_url
        self.pull = pull
        self.start_timeout = start_timeout
        #: Container starts, removals and execs this process sends the engine at once.
        self.concurrency = resolve_concurrency(concurrency)
        #: Who shares that bound: every host process of this user (``machine``), or this one.
        self.scope = resolve_scope(scope)
        self._gate = gate_for(
            base_url or os.environ.get("DOCKER_HOST") or "", self.concurrency, self.scope
        )
        self._lock = threading.Lock()
        self._probing = threading.Lock()
        self._client: Any = None
        #: The short addresses of the client's socket, open as long as the client is.
        self._addresses: EngineAddresses | None = None
        self._api: Any = None
        self._python_ok: dict[tuple[str, str], bool] = {}
        self._builds: dict[tuple[str, str], ServerBuild | None] = {}
        self._swept = False
        self._maps_uids: bool | None = None

    def maps_container_uids(self) -> bool:
        """Whether container uids are not host uids (a rootless or ``userns-remap`` engine).

        Asked once per engine. On such an engine the host uid behind the
        container's 65534 is the engine's business, so the mount check that
        judges host permissions for uid 65534 cannot be made.
        """
        with self._lock:
            if self._maps_uids is None:
                options = " ".join(self._client.api.info().get("SecurityOptions") or ())
                self._maps_uids = "name=rootless" in options or "name=userns" in options
            return self._maps_uids

    def is_local(self) -> bool:
        """Whether the engine listens on a unix socket of this Linux machine.

        Then its containers can be given a folder of this host, and connect to a
        socket in it (the direct channel); a remote engine, or one in a VM, cannot.
        """
        return sys.platform.startswith("linux") and str(self.api().base_url) == _LOCAL_URL

    def api(self) -> Any:
        """The SDK's low-level client, its ``runc`` requests gated (see ``_gate``).

        Raises ``BackendUnavailableError`` if no engine answers.
        """
        with self._lock:
            if self._client is None:
                self._client, self._addresses = self._connect()
                self._api = GatedApi(self._client.api, self._gate)
                # Close the engine connections when this engine is collected, not at exit.
                weakref.finalize(self, _close_client, self._client, self._addresses)
            return self._api

    def close(self) -> None:
        """Close the engine connections now (else they close when this engine is collected)."""
        with self._lock:
            client, self._client, self._api = self._client, None, None
            addresses, self._addresses = self._addresses, None
        if client is not None and addresses is not None:
            _close_client(client, addresses)

    def _connect(self) -> tuple[Any, EngineAddresses]:
        docker = import_docker()
        failure = ""
        addresses = EngineAddresses()
        # A kept connection for every request the bounds let through at once, so none is
        # opened and dropped per request (attach and exec streams take their own).
        pool = max(self._gate.pool_size, 10)
        try:
            if self.base_url is not None:
                client = docker.DockerClient(
                    base_url=addresses.url(self.base_url), version="auto", max_pool_size=pool
                )
            else:
                client = _client_from_context(docker, pool, addresses.url)
            if str(client.api.base_url) == _LOCAL_URL:
                # requests reads the proxy variables of the environment before every
                # request (1-3 ms each on a loaded 2-core host, five in a turn's start and
                # close), which the SDK's unix socket adapter then ignores.
                client.api.trust_env = False
            client.ping()
        except AstralVesselError:
            addresses.close()
            raise  # a socket's path that cannot be shortened says so itself
        except Exception as exc:
            failure = str(exc)
        else:
            return client, addresses
        addresses.close()
        # The SDK drops the socket of a refused connection without closing it; with the
        # exception (and its frames) gone, reap it now, quietly, not at a later collection.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        socket = engine_socket(self.base_url)
        facts = socket_facts(socket) if socket is not None else None
        raise BackendUnavailableError(no_engine_message(failure, socket, facts))

    @contextlib.contextmanager
    def failures(self, step: str) -> Iterator[None]:
        """Raise an engine request that fails during ``step`` as one ``BackendUnavailableError``.

        Errors of the library's own pass as they are; the SDK's (an answer the
        engine refused, a request it did not answer in time) are named with the
        step and the engine, not left as a bare HTTP error.
        """
        import requests

        docker = import_docker()
        try:
            yield
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            if isinstance(exc, AstralVesselError):
                raise
            client = self._client
            address = str(client.api.base_url) if client is not None else self.base_url
            raise BackendUnavailableError(start_failure(step, exc, str(address))) from None

    # -- images -------------------------------------------------------------------

    def ensure_image(self, name: str) -> str:
        """Return the id of image ``name``, pulling it if allowed; raise if it cannot be had."""
        api = self.api()
        docker = import_docker()
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

    def build(self, dockerfile: Path, *, base_image: str, base_id: str) -> str:
        """Build ``dockerfile`` once per content of its folder; reuse the tagged image after."""
        context = dockerfile.parent
        digest = context_digest(
            _context_files(context), dockerfile=dockerfile.name, base_image_id=base_id
        )
        tag = f"{BUILT_REPOSITORY}:{digest}"
        api = self.api()
        docker = import_docker()
        with contextlib.suppress(docker.errors.ImageNotFound):
            return str(api.inspect_image(tag)["Id"])
        log: list[str] = []
        error = ""
        try:
            for chunk in api.build(
                path=str(context),
                dockerfile=dockerfile.name,
                tag=tag,
                buildargs={"BASE_IMAGE": base_image},
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

    def has_python(self, image_id: str, python: str) -> bool:
        """Whether ``image_id`` runs ``python`` 3.8+ (checked once per image, in a throwaway).

        The same throwaway compiles the server's modules with that Python: its
        turns then load code instead of compiling 140 kB of source, most of a
        cold start (``server_build``).
        """
        key = (image_id, python)
        # One throwaway at a time: the turns that open together before the first answer wait
        # for it, rather than each starting a throwaway of its own (128 at once, say).
        with self._probing:
            with self._lock:
                known = self._python_ok.get(key)
            if known is not None:
                return known
            with _PYTHON_IMAGES_LOCK:
                build = _PYTHON_IMAGES.get(key)
            if build is not None:
                with self._lock:
                    self._python_ok[key] = True
                    self._builds[key] = build
                return True
            return self._probe_python(key)

    def _probe_python(self, key: tuple[str, str]) -> bool:
        image_id, python = key
        api = self.api()
        build: ServerBuild | None = None
        container = api.create_container(
            image_id,
            command=compile_command(python),
            user=f"{CALL_UID}:{CALL_UID}",
            labels={LABEL_TURN: "probe", LABEL_OWNER: owner()},
            host_config=api.create_host_config(
                network_mode="none", read_only=True, cap_drop=["ALL"]
            ),
        )
        status: int | None = None
        try:
            with contextlib.suppress(Exception):
                api.start(container)
            status = int(api.wait(container, timeout=self.start_timeout).get("StatusCode", 1))
            if status == 0:
                # Without the code (an engine that fails this one request) turns compile.
                with contextlib.suppress(Exception):
                    build = parse_build(api.logs(container, stdout=True, stderr=False))
        except Exception:
            status = None  # the engine did not answer (a loaded machine): no, for now only
        finally:
            with contextlib.suppress(Exception):
                api.remove_container(container, force=True)
        ok = status == 0
        if status is not None:
            with self._lock:
                self._python_ok[key] = ok
                self._builds[key] = build
        if ok and build is not None:
            with _PYTHON_IMAGES_LOCK:
                _PYTHON_IMAGES[key] = build
        return ok

    def server_build(self, image_id: str, python: str) -> ServerBuild | None:
        """The server's modules as ``has_python`` had the image compile them, if it did."""
        with self._lock:
            return self._builds.get((image_id, python))

    # -- containers ---------------------------------------------------------------

    def start_container(
        self, spec: ContainerSpec, *, on_close: Callable[[], None] | None = None
    ) -> AttachChannel:
        """Create the container ``spec`` describes, attach to its stdio, start it.

        A start the engine refused with a server error (a runtime failing under
        load) is made once more, on a new container, once the failed one is
        removed. Any other failure, or an engine that does not answer, raises
        one ``BackendUnavailableError`` naming the step and the engine.
        ``on_close`` runs once the channel has removed the container.
        """
        channel, _ = self.start_meeting(spec, on_close=on_close, meet=None)
        return channel

    def start_meeting(
        self,
        spec: ContainerSpec,
        *,
        on_close: Callable[[], None] | None,
        meet: Callable[[AttachChannel, Starting], _Met] | None,
    ) -> tuple[AttachChannel, _Met | None]:
        """``start_container``, calling ``meet(channel, starting)`` while the engine starts it.

        The engine's start takes most of a turn's start (runc, cgroups, mounts),
        and the container's process runs before the engine answers: ``meet``
        (the direct channel's accept) meets it meanwhile, watching ``starting``,
        which raises the engine's refusal (``result``) as a failed start. What
        ``meet`` raises otherwise passes as it is, the container removed. The
        start's answer may still be on its way when this returns: ``result``
        waits for it (``DirectChannel.settle``).
        """
        for attempt in (1, 2):
            try:
                return self._start_once(spec, on_close, meet)
            except _StartFailed as failed:
                if failed.refused:
                    raise CreateRefusedError(failed.message) from None
                if attempt == 2 or not failed.repeatable:
                    raise BackendUnavailableError(failed.message) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(
        self,
        spec: ContainerSpec,
        on_close: Callable[[], None] | None,
        meet: Callable[[AttachChannel, Starting], _Met] | None,
    ) -> tuple[AttachChannel, _Met | None]:
        api = self.api()
        step = "create"
        container_id: str | None = None
        attached: Any = None
        starting: Starting | None = None
        try:
            container_id = self._create(api, spec)
            step = "attach to"
            attached = api.attach_socket(
                container_id,
                params={"stdin": int(spec.open_stdin), "stdout": 1, "stderr": 1, "stream": 1},
            )
            channel = AttachChannel(
                api, container_id, attached, engine=str(api.base_url), on_close=on_close
            )
            raw_socket(attached).settimeout(None)
            step = "start"
            if meet is None:
                api.start(container_id)
                return channel, None
            starting = Starting(api, container_id)
            return channel, meet(channel, starting)
        except EngineRefused as refused:
            failure: Exception = refused.cause
        except BaseException as exc:
            if starting is not None:
                # ``meet``'s own failure (the server never connected): the container goes,
                # with the start's answer awaited so no request is left running.
                channel.close()
                with contextlib.suppress(Exception):
                    starting.result()
                raise
            if not isinstance(exc, Exception):
                raise
            failure = exc
        if attached is not None:
            close_attached(attached)
        removed = container_id is None or _remove(api, container_id)
        status = status_of(failure)
        raise _StartFailed(
            start_failure(step, failure, str(api.base_url)),
            repeatable=step == "start" and removed and status is not None and status >= 500,
            # Engines answer a setting they cannot use with 400 or 500 (an unparsable
            # bind is 500 on API 1.41): any answer is a refusal, silence is not.
            refused=step == "create" and status is not None,
        ) from None

    def _create(self, api: Any, spec: ContainerSpec) -> str:
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
            # server reads end of input and exits, and its container stops. A direct channel's
            # server has its socket for that (``_direct``), and no stdin.
            stdin_open=spec.open_stdin,
            hostname=HOSTNAME,
            # The client's proxy settings would add variables to the clean environment.
            use_config_proxy=False,
        )
        return str(created["Id"])

    # -- leftovers ------------------------------------------------------------------

    def sweep(self) -> int:
        """Remove containers of turns whose host process died; return how many were removed."""
        api = self.api()
        hostname = socket.gethostname()
        removed = 0
        for summary in api.containers(all=True, filters={"label": LABEL_TURN}):
            labels = summary.get("Labels") or {}
            if is_leftover(labels, hostname, process_start_time):
                with contextlib.suppress(Exception):
                    api.remove_container(summary["Id"], force=True)
                    removed += 1
        return removed

    def sweep_once(self) -> None:
        """Sweep on the first turn of this engine only; a failed sweep is not the turn's problem."""
        with self._lock:
            if self._swept:
                return
            self._swept = True
        with contextlib.suppress(Exception):
            self.sweep()


_Met = TypeVar("_Met")


class CreateRefusedError(BackendUnavailableError):
    """The engine answered a request to create a turn's container with a refusal.

    Most often the settings (a bind it cannot parse or find, say), rarely the
    engine itself: a refusal is never repeated as it is.
    """


class _StartFailed(Exception):
    """One attempt at a turn's container failed; whether a new attempt is safe, and whether
    the engine refused to create it."""

    def __init__(self, message: str, *, repeatable: bool, refused: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.repeatable = repeatable
        self.refused = refused


def _remove(api: Any, container_id: str) -> bool:
    """Remove a container that failed to start; whether it is gone."""
    try:
        api.remove_container(container_id, force=True)
    except Exception as exc:
        return status_of(exc) == 404
    return True


def owner() -> str:
    """This host process's owner label: host name, pid and the pid's start time."""
    pid = os.getpid()
    return owner_label(socket.gethostname(), pid, process_start_time(pid) or "?")


def _client_from_context(docker: Any, pool: int, shorten: Callable[[str], str]) -> Any:
    """A client for ``DOCKER_HOST``, else the CLI's current context, else the local socket.

    Each address goes through ``shorten`` (``EngineAddresses.url``) first.
    """
    host = os.environ.get("DOCKER_HOST")
    if host:
        environment = {**os.environ, "DOCKER_HOST": shorten(host)}
        return docker.from_env(version="auto", max_pool_size=pool, environment=environment)
    with contextlib.suppress(Exception):
        from docker.context import ContextAPI

        context = ContextAPI.get_current_context()
        if context is not None and context.name != "default" and context.Host:
            return docker.DockerClient(
                base_url=shorten(context.Host),
                tls=context.TLSConfig or False,
                version="auto",
                use_ssh_client=False,
                max_pool_size=pool,
            )
    for candidate in _podman_sockets():
        if not Path("/var/run/docker.sock").exists() and Path(candidate).exists():
            return docker.DockerClient(
                base_url=shorten(f"unix://{candidate}"), version="auto", max_pool_size=pool
            )
    return docker.from_env(version="auto", max_pool_size=pool)


def _close_client(client: Any, addresses: EngineAddresses) -> None:
    """Close an engine client's connections, then the short addresses it reached them by."""
    with contextlib.suppress(Exception):
        client.close()
    addresses.close()


def _podman_sockets() -> Iterator[str]:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        yield f"{runtime}/podman/podman.sock"
    yield "/run/podman/podman.sock"


def _sdk_host_config(values: Mapping[str, object]) -> dict[str, object]:
    """Turn the spec's plain values into the SDK's argument types."""
    docker = import_docker()
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
