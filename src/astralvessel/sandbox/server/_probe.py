"""The probe: which confinement steps work on this host (stdlib only, Python 3.8+).

Before a confining server starts its first call, a throwaway child takes every
step a call's chain takes (the zygote's and init's namespaces, a call's own user
namespace, the limits, the uid, ``no_new_privs``, the filter) and says which
failed and why. The server degrades what cannot work, and the host refuses to go
on unless it relaxed that promise. The answer depends on the host, not the turn,
so the host hands it to later turns started the same way (see ``_hello``).
"""

from __future__ import annotations

import os

from . import _launch, _sys, _userns

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["probe", "userns_problem"]


def probe(plan: _launch.LaunchPlan) -> dict[str, str]:
    """Try every confinement step once in a throwaway child; return each failed step with why.

    Keys: ``pid_namespace`` (unshare, fork, mount /proc), ``unprivileged`` (dropping
    to the uid, or as an ordinary user the call's own user namespace),
    ``user_namespace`` (as root, the call's own user namespace), ``no_new_privs``,
    ``seccomp``, ``rlimits``. Empty means all work.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        problems: dict[str, str] = {}
        try:
            _launch._child_signals()
            _probe_steps(plan, problems, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    report = _launch._read_to_end(read_end)
    os.waitpid(pid, 0)
    found: dict[str, str] = {}
    for line in report.decode("utf-8", "replace").splitlines():
        key, _, why = line.partition(" ")
        found[key] = why
    return found


def _probe_steps(plan: _launch.LaunchPlan, problems: dict[str, str], out: int) -> None:
    def fail(key: str, exc: BaseException) -> None:
        _launch._report(out, f"{key} {exc}")

    if plan.pid_namespace:
        _probe_namespaces(plan, fail)
        return
    _probe_confinement(plan, fail)


def _probe_namespaces(plan: _launch.LaunchPlan, fail: Callable[[str, BaseException], None]) -> None:
    """Take the zygote's and init's namespace steps, then probe confinement inside them."""
    try:
        # The zygote's launcher: a PID namespace for the zygote.
        _sys.unshare(_sys.CLONE_NEWPID)
        zygote = os.fork()
    except BaseException as exc:
        fail("pid_namespace", exc)
        return
    if zygote:
        os.waitpid(zygote, 0)
        return
    try:
        # The zygote: a PID namespace for one child, then back to its own.
        own = os.open("/proc/self/ns/pid", os.O_RDONLY)
        _sys.unshare(_sys.CLONE_NEWPID)
        init = os.fork()
        if init:
            _sys.setns(own, _sys.CLONE_NEWPID)
            os.waitpid(init, 0)
            os._exit(0)
        # Init: a mount namespace of its own with a fresh /proc.
        _sys.unshare(_sys.CLONE_NEWNS)
        _sys.mount(None, "/", None, _sys.MS_REC | _sys.MS_PRIVATE)
        _sys.mount("proc", "/proc", "proc", _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_NOEXEC)
    except BaseException as exc:
        fail("pid_namespace", exc)
    own_userns = False
    if plan.own_userns:
        try:
            _userns.enter_own_namespace(plan.drop_uid, plan.drop_gid, plan.inner_id)
            own_userns = True
        except BaseException as exc:
            fail(userns_problem(plan), exc)
    try:
        _probe_confinement(plan, fail, dropped=own_userns)
    finally:
        os._exit(0)


def userns_problem(plan: _launch.LaunchPlan) -> str:
    """The probe's key for a call's own user namespace that cannot be made.

    Without it, an ordinary user's calls would keep the server's capabilities
    (``unprivileged``); root's calls still drop to the host uid, but share its
    process count with every other turn (``user_namespace``).
    """
    return "unprivileged" if plan.drop_uid is None else "user_namespace"


def _probe_confinement(
    plan: _launch.LaunchPlan, fail: Callable[[str, BaseException], None], *, dropped: bool = False
) -> None:
    if plan.limits is not None:
        try:
            _launch._apply_limits(plan.limits)
        except BaseException as exc:
            fail("rlimits", exc)
    if not dropped:
        try:
            _launch._drop(plan.drop_uid, plan.drop_gid)
        except BaseException as exc:
            fail("unprivileged", exc)
    try:
        _sys.prctl(_sys.PR_SET_NO_NEW_PRIVS, 1)
    except BaseException as exc:
        fail("no_new_privs", exc)
    if plan.seccomp is not None:
        if plan.install_seccomp is None:
            fail("seccomp", OSError("the seccomp installer is missing from this server"))
            return
        try:
            plan.install_seccomp(plan.seccomp)
        except BaseException as exc:
            fail("seccomp", exc)
