"""The turn's setup in the sandbox server, from the host's ``hello`` (stdlib only, Python 3.8+).

The hello (``_messages.Hello``, checked as it is read) says once how every call
of the turn runs: confined or not, as which ids, under which limits, filter and
relaxations. Here it is turned into
the launch plan (probed, and degraded where a step cannot work on this host),
and the workspace and the relaxations the host opted into are made ready, all
before anything forks. The loop (``_main``) answers ``ready`` with what came of it.
"""

from __future__ import annotations

import os
import stat
import sys

from . import (
    _bounds,
    _heldfs,
    _launch,
    _lowerfs,
    _outbox,
    _probe,
    _protocol,
    _relay,
    _rootfs,
    _userns,
    _worker,
)
from ._calls import map_path
from ._lean import suppress
from ._messages import Hello, Ready

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "close_passed_lower",
    "helper_filter",
    "hold_workspace",
    "launch_plan",
    "lower_workspace",
    "prepare_workspace",
    "ready_frame",
    "relaxations",
    "start_relay",
    "worker_options",
    "workspace_problems",
]


def launch_plan(config: Hello) -> tuple[_launch.LaunchPlan, dict[str, str]]:
    """How the turn's calls launch, from its hello: the plan, degraded where the probe (or
    the host's answer from a turn started the same way) found a step cannot work, and what
    the probe found, by step."""
    installer = _seccomp_installer()
    plan = _launch.LaunchPlan(
        confine=config.confine,
        pid_namespace=config.confine,
        drop_uid=config.drop_uid,
        drop_gid=config.drop_gid,
        limits=config.limits if config.confine else None,
        seccomp=config.call_filter(),
        install_seccomp=installer,
        inner_id=0 if config.root_identity else _userns.CALL_ID,
        terminals=config.tool_servers,
    )
    problems: dict[str, str] = {}
    if plan.confine:
        _warm(plan)
        # A host that started a turn the same way before sends what that turn's probe
        # found: the answer depends on the host, not on the turn.
        probed = config.probed
        problems = _probe.probe(plan) if probed is None else dict(probed)
        # Degrade what cannot work; the host refuses to go on unless it relaxed that promise.
        if "pid_namespace" in problems:
            plan.pid_namespace = False
        if _probe.userns_problem(plan) in problems:
            plan.own_userns = False
        if "seccomp" in problems:
            plan.seccomp = None
    return plan, problems


_NEEDS_NAMESPACES = "needs a server that gives each call its own namespaces"


def _own_namespaces(plan: _launch.LaunchPlan) -> bool:
    return plan.confine and plan.pid_namespace


def _own_userns(plan: _launch.LaunchPlan) -> bool:
    """Whether each call (and each helper, as calls do) enters a user namespace of its own."""
    return _own_namespaces(plan) and plan.own_userns


def _writable_root(config: Hello, plan: _launch.LaunchPlan, workspace: str) -> Any:
    if not _own_namespaces(plan):
        return _NEEDS_NAMESPACES
    try:
        return _rootfs.make_root_writable(
            config.writable_root, workspace, config.drop_uid, config.drop_gid
        )
    except OSError as exc:
        return f"cannot make the root writable: {exc}"


def _tool_servers(config: Hello, plan: _launch.LaunchPlan, workspace: str) -> Any:
    # The filter the host sent allows the sockets and sessions; init mounts the
    # terminals, in each call's own mount namespace.
    return True if _own_namespaces(plan) else _NEEDS_NAMESPACES


def _root_identity(config: Hello, plan: _launch.LaunchPlan, workspace: str) -> Any:
    if _own_userns(plan):
        return plan.inner_id
    return "needs each call in a user namespace of its own"


#: Each relaxation a host may opt into (its hello field), and how it is given: what it
#: became, or a text saying why not. In this order: the writable root's mounts come first.
_RELAXATIONS: dict[str, Callable[[Hello, _launch.LaunchPlan, str], Any]] = {
    "writable_root": _writable_root,
    "tool_servers": _tool_servers,
    "root_identity": _root_identity,
}


def relaxations(config: Hello, plan: _launch.LaunchPlan, workspace: str) -> dict[str, Any]:
    """Give what the host opted into, before anything forks; say what each became or why not."""
    return {
        name: give(config, plan, workspace)
        for name, give in _RELAXATIONS.items()
        if getattr(config, name)
    }


def lower_workspace(
    config: Hello, plan: _launch.LaunchPlan, workspace: str, sources_to: list[int] | None = None
) -> tuple[Any, int]:
    """The workspace as an overlay on the snapshot's tree, when the host bound one: what
    came of it (``{"workspace_lower": True}`` or why not), nothing when none was bound;
    and a descriptor of its upper layer for the file worker (-1: no overlay).

    Before the outbox is made and before anything forks; where it cannot be, the host
    copies the snapshot's files in instead. ``sources_to`` takes the overlay's lower
    layers' descriptors (``_lowerfs.overlay_workspace``).
    """
    lower, held = config.workspace_lower, config.workspace_lower_fd
    upper = -1
    if lower is None and held is None:
        return {}, upper
    if not plan.confine or workspace != config.workspace:
        why: Any = "the workspace is a host folder here, not the sandbox's own tmpfs"
    elif config.writable_root:
        why = "the writable root's layers need the workspace's own tmpfs"
    else:
        try:
            upper = _lowerfs.overlay_workspace(
                workspace,
                lower,
                config.drop_uid,
                config.drop_gid,
                held=-1 if held is None else held,
                below=tuple(config.workspace_below_fds),
                layers=config.workspace_layers,
                sources_to=sources_to,
            )
            why = True
        except OSError as exc:
            why = f"cannot mount the workspace's overlay: {exc}"
    return {"workspace_lower": why}, upper


def hold_workspace(config: Hello, plan: _launch.LaunchPlan, workspace: str) -> int:
    """Make the workspace a tmpfs of the server's own, holding its detached original
    (``_heldfs``), where a freeze would hand it to an ordinary user's host: the sandbox's
    own empty tmpfs, in a user namespace. Its descriptor, or -1 (not here, or refused:
    a freeze is then refused too, and the host copies).

    Also under a fork's overlay on held layers (``workspace_lower_fd``): the overlay's
    upper folder is on that tmpfs, and a freeze of the fork's own layer clones it from the
    held original, which the forks of this fork, each in its own user namespace, can
    clone again (bubblewrap's, nsjail's, and Docker's, whose host asks it with
    ``hold_workspace`` only where the direct channel passes that layer on)."""
    if (
        not config.hold_workspace
        or not plan.confine
        or workspace != config.workspace
        or config.workspace_lower is not None
        or config.writable_root
        or _lowerfs.in_initial_userns()
    ):
        return -1
    disk = config.limits["disk_mb"] * 1024 * 1024
    try:
        return _heldfs.hold_workspace(workspace, disk, config.limits["workspace_inodes"])
    except OSError:
        return -1  # the launcher's tmpfs stays, bounded as before


def close_passed_lower(config: Hello) -> None:
    """Close the frozen layers' descriptors the host passed (their clones are laid, or
    they could not be): no call may inherit them."""
    for fd in (config.workspace_lower_fd, *config.workspace_below_fds):
        if fd is not None:
            with suppress(OSError):
                os.close(fd)


def workspace_problems(config: Hello, plan: _launch.LaunchPlan, workspace: str) -> dict[str, str]:
    """Bound the workspace's inodes if it is the sandbox's own tmpfs; say why not if that fails.

    A workspace mapped elsewhere (``path_map``) is a host folder the backend chose.
    """
    if not plan.confine or workspace != config.workspace:
        return {}
    why = _bounds.bound_inodes(workspace, config.limits["workspace_inodes"])
    return {"workspace_inodes": why} if why else {}


def clear_lower_outbox(outbox: str) -> None:
    """Remove an outbox the lower layer brought (a frozen layer is a turn's whole
    workspace tmpfs, its outbox and the files its calls left there included; a store
    tree holds none): a snapshot leaves the outbox out, so a turn opened from one starts
    with an empty outbox. In the overlay, so the layer keeps its files (whiteouts here).
    Before any call, never through a link (``rmtree`` follows none)."""
    try:
        if not stat.S_ISDIR(os.lstat(outbox).st_mode):
            return
    except OSError:
        return  # none: a store tree's
    import shutil  # here: only a frozen layer's turn needs it

    shutil.rmtree(outbox, ignore_errors=True)


def prepare_workspace(workspace: str, outbox: str, uid: int | None, gid: int | None) -> None:
    """Make the outbox and hand workspace and outbox to the call's user (best effort)."""
    try:
        # Never through a link: a workspace that came with files may hold one at the name.
        os.close(_outbox.open_root(outbox, uid, gid))
    except OSError as exc:
        print(f"astralvessel server: cannot create the outbox {outbox}: {exc}", file=sys.stderr)
    if uid is None or os.geteuid() != 0:
        return
    for path in (workspace, outbox):
        try:
            os.chown(path, uid, -1 if gid is None else gid, follow_symlinks=False)
        except OSError as exc:
            print(f"astralvessel server: cannot hand {path} to uid {uid}: {exc}", file=sys.stderr)


def worker_options(
    config: Hello, plan: _launch.LaunchPlan, workspace: str, outbox: str, upper: int = -1
) -> dict[str, Any]:
    """``_worker.start_worker``'s keywords: the file worker runs as the calls' user and
    sees the sandbox's paths as they are mapped on this side (and ``upper``, the
    overlay's upper layer, where the workspace is one)."""
    path_map = config.path_map
    return {
        "drop_uid": config.drop_uid,
        "drop_gid": config.drop_gid,
        "context": {
            "workdir": map_path(config.workdir, path_map),
            "visible_roots": tuple(map_path(r, path_map) for r in config.visible_roots),
            "path_map": dict(path_map),
            "workspace": workspace,
            "outbox": outbox,
            "writable_roots": tuple(map_path(r, path_map) for r in config.writable_roots),
            "upper": upper,
        },
        "own_userns": _own_userns(plan),
        "confine": plan.confine,
        "seccomp": helper_filter(config, plan, "file_worker"),
        "install_seccomp": plan.install_seccomp,
    }


def helper_filter(config: Hello, plan: _launch.LaunchPlan, name: str) -> bytes | None:
    """The filter helper ``name`` stacks over the server's: the host's, where the turn's
    calls get theirs (None where they get none: the host relaxed it or this host has none)."""
    if plan.seccomp is None:
        return None
    return config.helper_filter(name)


def start_relay(config: Hello, plan: _launch.LaunchPlan) -> tuple[int | None, bool | str | None]:
    """Start the egress relay if the turn allows a network: its pid, and True, None (no
    network) or why not.

    Forked first, while the server is a single thread with nothing of a call's open.
    """
    egress = config.egress
    if egress is None:
        return None, None
    try:
        relay = _relay.start(
            map_path(egress["socket"], config.path_map),
            egress["port"],
            config.drop_uid,
            config.drop_gid,
            own_userns=_own_userns(plan),
            confine=plan.confine,
            seccomp=helper_filter(config, plan, "relay"),
            install_seccomp=plan.install_seccomp,
        )
    except OSError as exc:
        return None, f"cannot listen on 127.0.0.1:{egress['port']}: {exc}"
    return relay, True


def ready_frame(
    plan: _launch.LaunchPlan,
    egress: bool | str | None,
    problems: dict[str, str],
    relaxations: dict[str, Any],
    probed: dict[str, str],
) -> dict[str, Any]:
    """The answer to the hello: what this server is and what came of each request."""
    ready = Ready(
        egress=egress,
        version=_protocol.VERSION,
        python=sys.version.split()[0],
        pid=os.getpid(),
        uid=os.getuid(),
        euid=os.geteuid(),
        gid=os.getgid(),
        confine=plan.confine,
        pid_namespace=plan.confine and plan.pid_namespace,
        seccomp=plan.seccomp is not None,
        fs=_worker._load_handler() is not None,
        problems=problems,
        relaxations=relaxations,
        probed=probed,
    )
    return ready.to_json()


def _seccomp_installer() -> Callable[[bytes], None] | None:
    try:
        from . import _seccomp
    except ImportError:
        return None
    install: Callable[[bytes], None] = _seccomp.install
    return install


def _warm(plan: _launch.LaunchPlan) -> None:
    """Do once, before any fork, the setup every call would otherwise repeat in its child."""
    with suppress(OSError, AttributeError):
        _launch.warm()
    if plan.seccomp is not None:
        try:
            from . import _seccomp
        except ImportError:
            return
        with suppress(ValueError, OSError, AttributeError):
            _seccomp.prepare(plan.seccomp)
