"""The Docker backends: one container per turn on a real engine, through the Docker SDK.

``Docker`` runs the sandbox server as the container's own process, on the
image's ``python3``, reached over a unix socket of the turn's own (``_direct``)
or, where that cannot be, the engine's attach stream: each call is a request
to the server, not a ``docker exec``. ``DockerExec`` (``docker-exec``)
is the explicit mode for images without a usable Python: no server, one
``docker exec`` per call, with the promises it cannot keep declared. Both
share the image logic: a forced ``image``, else the agent's Dockerfile
(``Policy.dockerfile``, validated by ``Agent.load``) built once per content
hash, else the base image. See ``docs/docker.md``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import shutil
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

from ...errors import BackendUnavailableError, PromiseNotEnforcedError, SandboxError
from .. import _seccomp
from .._base import BackendReport, Sandbox, SandboxSession, ServerLink, ServerOptions
from .._mechanisms import Setup, limit_mechanisms
from .._policy import Policy, Promise
from .._reach import Identity, check_reach
from .._session import ServerBuild, server_command
from .._uids import UidLease, default_lock_dir, describe_range, lease_uid, resolve_range
from ._adoption import adoption_pair, close_pair, lay_adoption
from ._attach import AttachChannel
from ._cow import HostOverlay
from ._direct import DirectChannel, Listener, NotConnectedError
from ._engine import BASE_IMAGE_ENV, CreateRefusedError, Engine, owner
from ._exec_session import EXEC_NOTE, ExecSession
from ._identity import write_identity
from ._reader import LayerReader, reader_spec
from ._spec import (
    CALL_UID,
    DEFAULT_BASE_IMAGE,
    IDLE_ARGV,
    LABEL_MODE,
    LABEL_OWNER,
    LABEL_POLICY,
    LABEL_TURN,
    MEMORY_EVENTS_FD,
    MEMORY_LIMIT_FD,
    ContainerSpec,
    container_spec,
    profile_text,
    server_argv,
)
from ._starting import Starting

__all__ = ["DEFAULT_BASE_IMAGE", "Docker", "DockerExec"]


@functools.cache
def _docker_profile(deny_list: _seccomp.DenyList | str, arch: str) -> str:
    """Docker's JSON profile of a shipped deny list, as text, rendered once per process.

    Every turn's is the same, and rendering it took 3 ms (the profile) and 1-5
    (its 40 kB of JSON) of each turn's start before its container was created.
    """
    return profile_text(_seccomp.to_docker_profile(deny_list, arch))


def _engine_profile(
    deny_list: _seccomp.DenyList | str, arch: str | None
) -> Mapping[str, object] | str:
    """The engine's seccomp profile for a container: the deny list's for ``arch``.

    A turn without an architecture (``_prepare``: seccomp relaxed) gets none at all.
    """
    return _docker_profile(deny_list, arch) if arch else {"defaultAction": "SCMP_ACT_ALLOW"}


#: The engine's profile for a server's container: the ``server`` list's unconditional rules.
#: Its 162 conditional entries cost runc's libseccomp about 25 ms of each container's
#: create, start and removal; the server installs the whole list itself, as the BPF
#: program bubblewrap gets, before it reads its code (``server_command(first_filter=)``).
_ENGINE_SERVER_LIST = _seccomp.SERVER.unconditional(name="server_by_name")


class Docker(Sandbox):
    """Run each turn in its own container on a Docker (or Podman) engine, the server inside.

    ``base_image`` is the image used when neither ``image`` nor a Dockerfile
    is given (default ``python:3.12-slim``, or ``$ASTRALVESSEL_DOCKER_IMAGE``).
    ``image`` forces one image for every turn. ``dockerfile`` is built once,
    with ``BASE_IMAGE`` as a build argument, and cached by the content hash of
    its folder; without it the policy's (the agent's ``[sandbox] dockerfile``)
    is used. ``base_url`` names the engine (else ``DOCKER_HOST`` and the
    current context, as the ``docker`` CLI does). ``pull`` lets a missing
    image be pulled. ``cpus`` caps each turn's CPU share.
    ``direct=False`` keeps every turn on the engine's attach stream, not a
    socket of its own (see ``open``).
    ``engine_concurrency`` bounds the container starts, removals and execs this
    host process sends the engine at once (default 8, or
    ``$ASTRALVESSEL_DOCKER_CONCURRENCY``); more wait their turn. ``engine_scope``
    says who shares that bound: ``"machine"`` (the default, or
    ``$ASTRALVESSEL_DOCKER_SCOPE``) counts every host process of this user on
    the same engine together, ``"process"`` each host process on its own.
    """

    name: ClassVar[str] = "docker"
    #: How ``doctor`` describes this backend's mode.
    mode: ClassVar[str] = "sandbox server in the container"
    #: Whether the sandbox server runs the calls (what ``doctor`` says bounds them).
    runs_server: ClassVar[bool] = True

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
        engine_concurrency: int | None = None,
        engine_scope: str | None = None,
        direct: bool = True,
    ) -> None:
        self.base_image = base_image or os.environ.get(BASE_IMAGE_ENV) or DEFAULT_BASE_IMAGE
        self.image = image
        self.dockerfile = None if dockerfile is None else Path(dockerfile).resolve()
        self.base_url = base_url
        self.python = python
        self.pull = pull
        self.cpus = cpus
        self.start_timeout = start_timeout
        self.engine = Engine(
            base_url,
            pull=pull,
            start_timeout=start_timeout,
            concurrency=engine_concurrency,
            scope=engine_scope,
        )
        #: Whether a turn's server may talk over a socket of its own rather than the
        #: engine's attach stream (where the engine is local; see ``open``).
        self.direct = direct
        #: The reader of frozen layers an ordinary user's host cannot read (``_reader``),
        #: made at its first read.
        self._reader: LayerReader | None = None
        self._reader_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(base_image={self.base_image!r})"
            if self.image is None
            else f"{type(self).__name__}(image={self.image!r})"
        )

    def sweep(self) -> int:
        """Remove containers of turns whose host process died; return how many were removed."""
        return self.engine.sweep()

    # -- the reader of frozen layers ----------------------------------------------------

    def _read_layer(self, fd: int) -> AbstractContextManager[Any]:
        """Reads of the frozen layer ``fd`` by this backend's reader (``_reader``)."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = LayerReader(self._start_reader)
            reader = self._reader
        return reader.layer(fd, self._reader_spec)

    def _fork_layers(self, policy: Policy, lease: UidLease | None) -> tuple[int, ...]:
        """An ordinary user's frozen layers for a fork (``policy.workspace_lower_fd``, then
        a stack's ``workspace_below_fds``, top first), each made the fork's own by the
        reader: an idmapped clone showing the files of the turn that wrote that layer as
        the fork's leased uid's (``LayerReader.idmapped``). Empty where there are none to
        pass. ``SandboxError`` where the reader cannot make one."""
        top = policy.workspace_lower_fd
        if top is None or lease is None or os.geteuid() == 0:
            return ()
        mapped: list[int] = []
        try:
            for fd in (top, *policy.workspace_below_fds):
                mapped.append(self._idmapped(lease, fd))
        except OSError as exc:
            for fd in mapped:
                os.close(fd)
            # No copy instead: the host cannot read the layer's files to copy them in.
            raise SandboxError(f"the frozen layer cannot be made the fork's: {exc}") from exc
        return tuple(mapped)

    def _merged(self, layers: tuple[int, ...], userxattr: bool) -> int:
        """The merged view of an ordinary user's stack of frozen layers, made by the reader
        (``LayerReader.merged``; ``session.merge_layers``). ``OSError`` where it cannot be."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = LayerReader(self._start_reader)
            reader = self._reader
        return reader.merged(layers, userxattr, self._reader_spec)

    def _idmapped(self, lease: UidLease, fd: int) -> int:
        """The frozen layer ``fd`` as ``lease``'s uid's, made by the reader
        (``LayerReader.idmapped``): a fork's at its start, or an adopting warm sandbox's
        (``ServerLink.fit_layer``, see ``_adoption``). ``OSError`` where it cannot be."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = LayerReader(self._start_reader)
            reader = self._reader
        return reader.idmapped(fd, lease.uid, lease.gid, self._reader_spec)

    def _start_reader(
        self, spec: ContainerSpec, meet: Callable[[AttachChannel, Starting], Any]
    ) -> tuple[AttachChannel, Any]:
        return self.engine.start_meeting(spec, on_close=None, meet=meet)

    def _reader_spec(self, folder: str) -> ContainerSpec:
        policy = Policy()
        return reader_spec(
            folder,
            image=self._turn_image(policy),
            python=self.python,
            seccomp_profile=_engine_profile(_ENGINE_SERVER_LIST, _seccomp.available_arch()),
            labels=self._labels(policy, "reader"),
        )

    # -- the turn's image -------------------------------------------------------------

    def _turn_image(self, policy: Policy) -> str:
        """The image id for a turn: forced image, built Dockerfile, or the base image."""
        if self.image is not None:
            return self.engine.ensure_image(self.image)
        dockerfile = self.dockerfile or policy.dockerfile
        base_id = self.engine.ensure_image(self.base_image)
        if dockerfile is None:
            return base_id
        return self.engine.build(dockerfile, base_image=self.base_image, base_id=base_id)

    def _lease(self, policy: Policy) -> UidLease | None:
        """The turn's own host uid, or None where the engine maps container uids itself.

        A rootless or ``userns-remap`` engine maps only its own small range
        (65 536 ids from a subuid base), so a leased id would not exist in the
        container; there the container keeps uid 65534 of the engine's map.
        """
        self.engine.api()
        if self.engine.maps_container_uids():
            return None
        return lease_uid(resolve_range(policy.uid_range), default_lock_dir())

    def _prepare(self, policy: Policy, lease: UidLease | None) -> tuple[str, Any]:
        """The turn's image id and seccomp architecture; fail closed without a filter."""
        # A folder the calls (the turn's uid) cannot use is the host's mistake: say so now,
        # as the namespace backends do, not in a tool result.
        if lease is not None:
            check_reach(self.name, policy, Identity(uid=lease.uid, gid=lease.gid, per_turn=True))
        elif not self.engine.maps_container_uids():
            check_reach(self.name, policy, Identity(uid=CALL_UID, gid=CALL_UID))
        self.engine.sweep_once()
        arch = _seccomp.available_arch()
        if arch is None and Promise.SECCOMP not in policy.relaxed:
            raise PromiseNotEnforcedError(
                self.name,
                Promise.SECCOMP.value,
                f"no seccomp filter is built for {platform.machine()}",
            )
        return self._turn_image(policy), arch

    def _labels(self, policy: Policy, mode: str) -> dict[str, str]:
        return {
            LABEL_TURN: "1",
            LABEL_OWNER: owner(),
            LABEL_MODE: mode,
            LABEL_POLICY: policy.identity,
        }

    # -- the Sandbox contract ---------------------------------------------------------

    def probe(self) -> BackendReport:
        """Say whether an engine answers and, by starting a trial turn, which promises it keeps."""
        try:
            api = self.engine.api()
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
            "user": (
                f"uid {CALL_UID} in a user namespace of its own, no capabilities; on the host "
                f"a uid of {describe_range()} of the turn's own"
                if self.runs_server
                else f"the turn's own host uid of {describe_range()} (it has no name), "
                "no capabilities"
            ),
            "mode": self.mode,
        }
        if self.runs_server:
            try:
                details["egress proxy"] = proxy_admission(self.engine.maps_container_uids())
            except Exception as exc:
                details["egress proxy"] = f"unknown ({exc})"
        try:
            cgroup = f"cgroup v{api.info().get('CgroupVersion') or '?'}"
        except Exception:
            cgroup = "engine's"
        mechanisms = limit_mechanisms(
            Setup(memory_cgroup=cgroup, pids_cgroup=cgroup, server=self.runs_server)
        )
        try:
            session = self.start(Policy().relax(*Promise))
        except Exception as exc:
            return BackendReport(
                name=self.name,
                available=False,
                reason=f"a trial turn failed: {exc}",
                details=details,
                mechanisms=mechanisms,
            )
        try:
            unenforced = dict(session.unenforced())
        finally:
            session.close()
        return BackendReport(
            name=self.name,
            available=True,
            binary=None,
            enforced=frozenset(p for p in Promise if p not in unenforced),
            unenforced=unenforced,
            details=details,
            mechanisms=mechanisms,
        )

    def open(self, policy: Policy) -> ServerLink:
        """Start one turn's container with the server as its process; return the channel to it.

        The channel is a unix socket of the turn's own (``_direct``) when the
        engine is local and the turn has a host uid to check the peer against;
        else the engine's attach stream. A host whose policy keeps containers
        from connecting to its socket (an SELinux label, say), or an engine that
        cannot bind the socket's folder (a snap Docker, whose /tmp is its own,
        may refuse it at create) is found at its first turn, which then starts
        again on the attach stream, as later ones do once that worked.
        """
        lease = self._lease(policy)
        try:
            with self.engine.failures("prepare"):
                try:
                    return self._open_as(policy, lease, direct=self._direct_for(lease))
                except NotConnectedError:
                    if lease is not None:
                        lease.release()
                    lease = self._lease(policy)
                    link = self._open_as(policy, lease, direct=False)
                    self.direct = False
                    return link
        except BaseException:
            if lease is not None:
                lease.release()
            raise

    def _direct_for(self, lease: UidLease | None) -> bool:
        return self.direct and lease is not None and self.engine.is_local()

    def adopts_warm_here(self) -> bool:
        """Whether this engine's warm sandboxes can be adopted by a fork (``_adoption``):
        their channel is the direct one (a local engine, a leased uid). Else a fork taking
        one would only close it and start its own."""
        return self.direct and self.engine.is_local() and not self.engine.maps_container_uids()

    def _open_as(self, policy: Policy, lease: UidLease | None, *, direct: bool) -> ServerLink:
        image_id, arch = self._prepare(policy, lease)
        if not self.engine.has_python(image_id, self.python):
            raise BackendUnavailableError(
                f"docker cannot run the sandbox server: image "
                f"{self.image or policy.dockerfile or self.base_image} has no {self.python} 3.8+. "
                "Use an image with python3, or the docker-exec backend (one `docker exec` per "
                "call, without process isolation or the file tools)"
            )
        build = self.engine.server_build(image_id, self.python)
        overlay = self._host_overlay(policy, lease)
        layers = self._fork_layers(policy, lease) if direct else ()
        lower_fd = layers[0] if layers else None
        host_end, server_end = adoption_pair(policy, lease, direct=direct)
        listener = None
        if lease is not None and direct:
            # A host whose temporary folder cannot be written, or whose socket's path
            # cannot be shortened (``_unixsock``), has this turn on the attach stream.
            with contextlib.suppress(OSError, BackendUnavailableError):
                listener = Listener(lease.uid)
        try:
            channel = self._start_server(
                policy,
                lease,
                image_id=image_id,
                arch=arch,
                build=build,
                listener=listener,
                overlay=overlay,
            )
        except BaseException:
            if overlay is not None:
                overlay.close()
            for fd in layers:
                os.close(fd)
            close_pair(host_end, server_end)
            raise
        finally:
            if listener is not None:
                listener.close()
        direct_channel = isinstance(channel, DirectChannel)
        if layers and not direct_channel:  # pragma: no cover - direct asked
            for fd in layers:
                os.close(fd)
            layers, lower_fd = (), None
        if not direct_channel:  # the attach stream passes no socket: never adopted
            host_end, server_end = close_pair(host_end, server_end)
        return ServerLink(
            channel=channel,
            settle=channel.settle if isinstance(channel, DirectChannel) else None,
            options=ServerOptions(
                confine=True,
                # An ordinary user's workspace is the server's own tmpfs, its original held
                # to pass on a freeze (``_frozen``): a fresh turn's, or a fork's on held layers
                # (its own layer is frozen from it, ``freeze_fork``); root's host freezes
                # the engine's.
                hold_workspace=(
                    direct_channel
                    and os.geteuid() != 0
                    and policy.workspace_lower is None
                    and (policy.workspace_lower_fd is None or lower_fd is not None)
                ),
                # A frozen layer an ordinary user's host holds goes with the hello (a
                # stack's layers below it after it, ``below_fds``).
                pass_lower_fd=lower_fd is not None,
                # So does a warm sandbox's adoption socket (``_adoption``).
                adopt_socket=None if server_end is None else server_end.detach(),
                pass_adopt_socket=server_end is not None,
                # Where the engine maps container uids (no lease), the host cannot know it.
                peer_uid=None if lease is None else lease.uid,
                # The container already runs as the turn's uid; in its user namespace only that
                # uid exists, so there is nothing to drop to: a call loses its capabilities.
                seccomp=(
                    _seccomp.compiled(
                        _seccomp.calls_list(policy.root_identity, policy.tool_servers), arch
                    )
                    if arch
                    else None
                ),
                helper_seccomp=_seccomp.helper_programs(arch) if arch else {},
                ready_timeout=self.start_timeout,
                probe_key=f"{self.name}:{self.engine.base_url}:{image_id}:{self.python}",
                build=build,
                memory_events=(f"/proc/self/fd/{MEMORY_EVENTS_FD}",),
                memory_limits=(f"/proc/self/fd/{MEMORY_LIMIT_FD}",),
            ),
            lower_laid=(
                (None if lower_fd is not None else False)  # none to pass on: a copy
                if policy.workspace_lower_fd is not None
                else None
                if policy.workspace_lower is None and not policy.workspace_layers
                else overlay is not None
            ),
            lower_fd=lower_fd,
            below_fds=layers[1:],
            adopt_socket=host_end,
            # An ordinary user's server lays the layers its reader fits; root's host lays
            # the overlay itself (``_adoption.lay_adoption``: its layers' marks are
            # ``trusted.*``, which the container's own overlay would not read).
            fit_layer=(
                None
                if host_end is None or lease is None
                else functools.partial(self._idmapped, lease)
            ),
            lay_adoption=(
                None
                if host_end is None or lease is None or os.geteuid() != 0
                else functools.partial(lay_adoption, lease, policy.limits)
            ),
            upper_names=None if overlay is None else overlay.upper_names,
            widen_memory=channel.widen_memory,
            # An ordinary user's host cannot read the turn's frozen files: its reader does.
            read_layer=self._read_layer if direct_channel and os.geteuid() != 0 else None,
            # And merges a stack of them, a fork of a fork's (``_freeze.snapshot_stacked``).
            merge_layers=self._merged if direct_channel and os.geteuid() != 0 else None,
        )

    def _host_overlay(self, policy: Policy, lease: UidLease | None) -> HostOverlay | None:
        """The turn's workspace laid by the host on the snapshot's tree (``_cow``), where it
        can be: a root host, a local engine, a leased uid, no writable root. Else None, and the
        files are copied (an ordinary user cannot mount; an engine that maps uids hides the
        calls' host uid; the root's layers need the workspace's own tmpfs, not an overlay).
        A stack of frozen layers (``policy.workspace_layers``, a fork of a fork's) is laid
        alike, on its layers themselves."""
        lower: str | tuple[str, ...] | None = (
            tuple(str(layer) for layer in policy.workspace_layers)
            if policy.workspace_layers
            else None
            if policy.workspace_lower is None
            else str(policy.workspace_lower)
        )
        if lower is None or lease is None or os.geteuid() != 0:
            return None
        if policy.writable_root:
            return None
        if not self.engine.is_local():
            return None
        try:
            return HostOverlay(lower, lease.uid, lease.gid, policy.limits)
        except OSError:
            return None  # a kernel without overlays over an idmapped layer (5.19): a copy

    def _start_server(
        self,
        policy: Policy,
        lease: UidLease | None,
        *,
        image_id: str,
        arch: Any,
        build: ServerBuild | None,
        listener: Listener | None,
        overlay: HostOverlay | None,
    ) -> AttachChannel | DirectChannel:
        """Create and start the container; with ``listener``, wait for the server to connect.

        ``overlay`` is bound as the workspace, and unmounted once the container is removed."""
        spec = container_spec(
            policy,
            image=image_id,
            command=server_argv(
                server_command(
                    self.python,
                    build,
                    first_filter=_seccomp.compiled(_seccomp.SERVER, arch) if arch else None,
                ),
                policy,
                direct=listener is not None,
            ),
            seccomp_profile=_engine_profile(_ENGINE_SERVER_LIST, arch),
            labels=self._labels(policy, "server"),
            server=True,
            cpus=self.cpus,
            uid=CALL_UID if lease is None else lease.uid,
            channel_dir=None if listener is None else listener.folder,
            workspace=None if overlay is None else overlay.workspace,
        )
        # The workspace's overlay goes, and the lease goes back, once the container is removed.
        on_close = _after_removal(overlay, lease)
        if listener is None:
            return self.engine.start_container(spec, on_close=on_close)

        def meet(attach: AttachChannel, starting: Starting) -> DirectChannel:
            # While the engine answers the start, the server connects and boots.
            return DirectChannel(
                listener.accept(attach, self.start_timeout, starting), attach, starting
            )

        try:
            _, channel = self.engine.start_meeting(spec, on_close=on_close, meet=meet)
        except CreateRefusedError as refused:
            raise NotConnectedError(
                f"the engine cannot bind the channel's folder: {refused}"
            ) from None
        assert channel is not None  # noqa: S101 - start_meeting returns what meet made
        return channel


class DockerExec(Docker):
    """``docker-exec``: a container per turn with no server; each call is one ``docker exec``.

    For images without a usable ``python3``. Calls run one at a time, the file
    tools are unavailable, and a call can see the container's idle first
    process (``probe`` and ``SandboxSession.unenforced`` say so). Never chosen
    automatically. Takes the same settings as ``Docker``.
    """

    name: ClassVar[str] = "docker-exec"
    mode: ClassVar[str] = f"exec per call: {EXEC_NOTE}"
    #: With no server to map a call's ids, calls are the turn's leased host uid itself (not
    #: 65534, a name in every image's passwd): the kernel counts ``ulimit -p`` per uid, so
    #: turns sharing one uid would share one process limit (a forking tool at 64 turns met
    #: "Cannot fork" below its own limit), and what one turn wrote in a shared writable
    #: mount would be another's.
    runs_server: ClassVar[bool] = False

    def open(self, policy: Policy) -> ServerLink:
        """This mode runs no sandbox server, so there is no channel to one."""
        raise BackendUnavailableError(
            "docker-exec runs no sandbox server; start a turn with start(policy)"
        )

    def start(self, policy: Policy) -> SandboxSession:
        """Start one turn's idle container, ready for one ``docker exec`` per call.

        Choosing this backend by name is the host's explicit choice of a mode
        that does not keep ``EXEC_UNENFORCED`` (as choosing ``unconfined``
        is), so those promises need no relaxing; discovery never picks it.
        The eval relaxations need the server's layers and namespaces: asked
        for, they raise ``BackendUnavailableError`` rather than go unmet.
        """
        if policy.egress_socket is not None:
            raise BackendUnavailableError(
                "docker-exec runs no sandbox server to relay calls to the egress proxy; "
                "use the docker backend for a turn with a network allow-list"
            )
        for name in ("writable_root", "root_identity", "tool_servers"):
            if getattr(policy, name):
                raise BackendUnavailableError(
                    f"docker-exec cannot give {name}: it runs no sandbox server to make it; "
                    "choose the docker backend"
                )
        lease = self._lease(policy)
        try:
            with self.engine.failures("prepare"):
                return self._start_exec(policy, lease)
        except BaseException:
            if lease is not None:
                lease.release()
            raise

    def _start_exec(self, policy: Policy, lease: UidLease | None) -> SandboxSession:
        image_id, arch = self._prepare(policy, lease)
        # A leased uid has no name in the image: the turn's own passwd names it nobody. Only
        # an engine on this machine can bind a file the host just wrote.
        etc_dir = (
            write_identity(lease.uid) if lease is not None and self.engine.is_local() else None
        )
        try:
            return self._start_exec_container(policy, lease, image_id, arch, etc_dir)
        except BaseException:
            if etc_dir is not None:
                shutil.rmtree(etc_dir, ignore_errors=True)
            raise

    def _start_exec_container(
        self,
        policy: Policy,
        lease: UidLease | None,
        image_id: str,
        arch: Any,
        etc_dir: str | None,
    ) -> SandboxSession:
        spec = container_spec(
            policy,
            image=image_id,
            command=IDLE_ARGV,
            seccomp_profile=_engine_profile("calls", arch),
            labels=self._labels(policy, "exec"),
            server=False,
            cpus=self.cpus,
            uid=CALL_UID if lease is None else lease.uid,
            identity_dir=etc_dir,
        )
        channel = self.engine.start_container(
            spec, on_close=None if lease is None else lease.release
        )
        session = ExecSession(
            self.engine.api(),
            channel,
            policy,
            backend=self.name,
            uid=CALL_UID if lease is None else lease.uid,
            start_timeout=self.start_timeout,
            etc_dir=etc_dir,
        )
        try:
            session.prepare()
        except BaseException:
            session.close()
            raise
        return session


def _after_removal(
    overlay: HostOverlay | None, lease: UidLease | None
) -> Callable[[], None] | None:
    """What a turn's container leaves to do once it is removed: the overlay, then the lease."""
    if overlay is None:
        return None if lease is None else lease.release
    if lease is None:
        return overlay.close

    def both() -> None:
        try:
            overlay.close()
        finally:
            lease.release()

    return both


def proxy_admission(maps_container_uids: bool) -> str:
    """Who may connect to a turn's egress proxy socket on this engine (doctor's line).

    The proxy admits only the sandbox's host uid; an engine that maps container uids itself
    (rootless Docker, ``userns-remap``) hides that uid from the host, so there the socket
    stays open to every local user (see the threat model).
    """
    if maps_container_uids:
        return (
            "open to every local user: this engine maps container uids itself, so the host "
            "cannot know the sandbox's uid to admit it alone"
        )
    return "the sandbox's host uid only (socket mode 0600, each peer's uid checked)"
