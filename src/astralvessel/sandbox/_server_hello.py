"""The host's half of a turn's start: the ``hello`` it sends and what it makes of ``ready``.

Both messages are defined once, in ``server/_messages``; here the hello is built
from the policy and the backend's options, a probe found by a turn started the
same way is handed on, and the server's answer is checked against what the
policy promised (``PromiseNotEnforcedError`` unless it relaxed that promise).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from ..errors import BackendUnavailableError, PromiseNotEnforcedError, SandboxError
from ._policy import (
    EGRESS_DIR,
    EGRESS_PORT,
    EGRESS_SOCKET_NAME,
    OUTBOX_DIR,
    ROOT_DIRS,
    SYSTEM_DIRS,
    WORKSPACE_DIR,
    WORKSPACE_LOWER_DIR,
    Policy,
    Promise,
)
from ._server_options import ServerOptions
from .server import _protocol
from .server._messages import Hello, Ready

__all__ = [
    "check_ready",
    "hello_message",
    "known_probe",
    "read_ready",
    "remember_probe",
    "unenforced_promises",
]

# Which promises a failed confinement step breaks (keys are the server's probe steps).
_PROBLEM_PROMISES: dict[str, tuple[Promise, ...]] = {
    "pid_namespace": (Promise.PROCESS_ISOLATION, Promise.NO_NEW_SESSIONS),
    "unprivileged": (Promise.UNPRIVILEGED,),
    "user_namespace": (Promise.PROCESS_LIMIT,),
    "no_new_privs": (Promise.UNPRIVILEGED,),
    "seccomp": (Promise.SECCOMP,),
    "workspace_inodes": (Promise.DISK_LIMIT,),
    "rlimits": (
        Promise.OPEN_FILES_LIMIT,
        Promise.DISK_LIMIT,
        Promise.MEMORY_LIMIT,
        Promise.PROCESS_LIMIT,
    ),
}


#: Probe results kept at most (``remember_probe``): a host that starts turns in many ways
#: probes again past this many.
_PROBED_MOST = 64

#: Hello fields that name this turn's own places, not how its calls are confined.
_TURN_PLACES = frozenset(
    (
        "env",
        "workdir",
        "workspace",
        "outbox",
        "visible_roots",
        "path_map",
        "egress",
        "probed",
        "memory_events",
        "memory_limits",
    )
)


def hello_message(policy: Policy, options: ServerOptions, *, file_worker_idle: float) -> Hello:
    """The hello for a turn under ``policy``, started as the backend's ``options`` say;
    ``probed`` is left for ``known_probe`` to fill."""
    limits = policy.limits
    seccomp = options.seccomp
    return Hello(
        confine=options.confine,
        drop_uid=options.drop_uid,
        drop_gid=options.drop_gid,
        seccomp=None if seccomp is None else base64.b64encode(seccomp).decode("ascii"),
        helper_seccomp={
            name: base64.b64encode(program).decode("ascii")
            for name, program in options.helper_seccomp.items()
        },
        env=dict(policy.environment),
        workdir=str(policy.workdir),
        workspace=str(WORKSPACE_DIR),
        outbox=str(OUTBOX_DIR),
        limits={
            "disk_mb": limits.disk_mb,
            "memory_mb": limits.memory_mb,
            "processes": limits.processes,
            "open_files": limits.open_files,
            "workspace_inodes": limits.workspace_inodes,
        },
        visible_roots=[str(root) for root in policy.visible_roots],
        writable_roots=[str(root) for root in policy.writable_roots],
        path_map=dict(options.path_map),
        egress=(
            None
            if policy.egress_socket is None
            else {"socket": str(EGRESS_DIR / EGRESS_SOCKET_NAME), "port": EGRESS_PORT}
        ),
        writable_root=(
            [str(d) for d in (*SYSTEM_DIRS, *ROOT_DIRS)] if policy.writable_root else []
        ),
        root_identity=policy.root_identity,
        tool_servers=policy.tool_servers,
        # The snapshot's tree the workspace's overlay lies on (None: an empty workspace).
        workspace_lower=(
            None
            if policy.workspace_lower is None and not policy.workspace_layers
            else str(WORKSPACE_LOWER_DIR)
        ),
        # Or a stack of layers, bound at "0", "1"... in it, top first.
        workspace_layers=len(policy.workspace_layers),
        # Or a frozen layer the host holds, passed at the same number (``_nsbackend``).
        workspace_lower_fd=policy.workspace_lower_fd,
        # And the held layers below it, a stack's (passed at the same numbers too).
        workspace_below_fds=list(policy.workspace_below_fds),
        hold_workspace=options.hold_workspace,
        adopt_socket=options.adopt_socket,
        file_worker_idle=file_worker_idle,
        memory_events=list(options.memory_events),
        memory_limits=list(options.memory_limits),
        probed=None,
    )


def _probe_key(key: str | None, hello: Hello) -> str | None:
    """What a probe's result depends on; ``None`` when it is not to be reused.

    Every hello field but the turn's places counts (a field added later counts
    too, unless listed), except that only whether calls drop to a uid matters,
    not which one: every uid a turn gets maps alike.
    """
    if key is None or not hello.confine:
        return None
    settings = {k: v for k, v in hello.fields().items() if k not in _TURN_PLACES}
    settings["drop_uid"] = hello.drop_uid is None
    settings["drop_gid"] = hello.drop_gid is None
    settings["workspace_lower_fd"] = hello.workspace_lower_fd is None  # its number varies
    settings["workspace_below_fds"] = len(hello.workspace_below_fds)
    settings["adopt_socket"] = hello.adopt_socket is None
    import json  # here: most hosts never reuse a probe

    return key + "\0" + json.dumps(settings, sort_keys=True)


def known_probe(
    probed: Mapping[str, dict[str, str]], key: str | None, hello: Hello
) -> tuple[str | None, Hello]:
    """The probe's key for this hello (``ServerOptions.probe_key``), and the hello with
    what a turn started the same way found in ``probed``, if one did (the server then
    does not probe)."""
    probe_key = _probe_key(key, hello)
    known = None if probe_key is None else probed.get(probe_key)
    return probe_key, hello if known is None else hello.replace(probed=known)


def remember_probe(
    probed: dict[str, dict[str, str]], key: str | None, hello: Hello, ready: Ready
) -> None:
    """Keep in ``probed`` what the server's probe found, for the next turn started the
    same way; past ``_PROBED_MOST`` turns started in different ways, start over."""
    if key is not None and hello.probed is None:
        if len(probed) >= _PROBED_MOST:
            probed.clear()
        probed[key] = dict(ready.probed)


def read_ready(backend: str, header: Mapping[str, object]) -> Ready:
    """The server's ``ready``, once it is known to speak this library's protocol."""
    if header.get("version") != _protocol.VERSION:
        raise SandboxError(
            f"the {backend} sandbox server speaks protocol {header.get('version')!r}, "
            f"this library {_protocol.VERSION}: reinstall astralvessel"
        )
    try:
        ready: Ready = Ready.from_json(dict(header))
    except (TypeError, ValueError) as exc:
        raise SandboxError(f"the {backend} sandbox server broke protocol ({exc})") from None
    return ready


def check_ready(backend: str, policy: Policy, hello: Hello, ready: Ready) -> None:
    """Refuse a turn whose server cannot give what ``policy`` asks (unless it relaxed it)."""
    if policy.egress_socket is not None and ready.egress is not True:
        raise SandboxError(
            f"the {backend} sandbox server cannot relay calls to the egress proxy: "
            f"{ready.egress or 'it does not know how'}"
        )
    # The eval relaxations the host asked for: given, or the turn does not start.
    asked = {
        "writable_root": policy.writable_root,
        "root_identity": policy.root_identity,
        "tool_servers": policy.tool_servers,
    }
    for name, wanted in asked.items():
        given = ready.relaxations.get(name)
        if wanted and isinstance(given, (str, type(None))):
            why = given or "this server does not offer it"
            raise BackendUnavailableError(f"{backend} cannot give {name} here: {why}")
    if not hello.confine:
        return
    problems = dict(ready.problems)
    if hello.seccomp is not None and not ready.seccomp:
        problems.setdefault("seccomp", "the server cannot install a seccomp filter")
    for promise, why in unenforced_promises(problems).items():
        if promise not in policy.relaxed:
            raise PromiseNotEnforcedError(backend, promise.value, why)


def unenforced_promises(problems: Mapping[str, str]) -> dict[Promise, str]:
    """Map the server's failed probe steps to the promises they break, each with why."""
    broken: dict[Promise, str] = {}
    for step, why in problems.items():
        for promise in _PROBLEM_PROMISES.get(step, ()):
            broken.setdefault(promise, f"{step}: {why}")
    return broken
