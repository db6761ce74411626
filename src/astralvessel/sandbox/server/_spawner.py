"""Where each call's processes come from, in the sandbox server (stdlib only, Python 3.8+).

A confining server with a PID namespace runs every call on a *chain*: namespaces
and an init that the zygote forks (``_zygote``) and that waits for its request
(``_launch``). One chain, the *spare*, is built ahead of time, so a call takes
it and the forks stay off the call's path; the loop (``_main``) decides when the
next is built. A call that names its user, or finds no live spare, has a chain
built on demand. A server without namespaces starts each call as a plain
process group.
"""

from __future__ import annotations

from . import _launch, _zygote
from ._lean import suppress

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._calls import RunOrder

__all__ = ["Spawner"]


class Spawner:
    """The turn's source of calls: its launch plan, the zygote and the spare chain."""

    def __init__(self, plan: _launch.LaunchPlan, env: dict[str, str], root_identity: bool) -> None:
        self.plan = plan
        #: Every call's environment (the host's, mapped), before its own variables.
        self.env = env
        #: Whether a call may name the ids it sees: root_identity, given, with each call
        #: in a user namespace of its own (the only ids it can have map to the turn's).
        self.may_name_user = bool(
            root_identity and plan.confine and plan.pid_namespace and plan.own_userns
        )
        #: Whether calls run on chains (a PID namespace each) rather than as groups.
        self.chains = plan.confine and plan.pid_namespace
        #: The next call's prepared namespaces.
        self.spare: _launch.Spawned | None = None
        #: Forks every call's namespaces (see ``_zygote``); started on first need.
        self.zygote: _zygote.Zygote | None = None

    def spawn(
        self, order: RunOrder, argv: list[str], cwd: str, extra_env: dict[str, str]
    ) -> _launch.Spawned:
        """Start the call: on the spare, on a chain of its own, or (no namespaces) a group.

        Raises ``OSError`` with the message for the host when it cannot start.
        """
        split = order.split
        if order.identity is not None and not self.may_name_user:
            raise OSError("a call may name its user only under root_identity")
        # The spare's init is in its user namespace already, as the turn's own ids.
        spawned = (
            self._start_on_spare(argv, cwd, extra_env, split, order.detach)
            if order.identity is None
            else None
        )
        if spawned is not None:
            return spawned
        if not self.chains:
            return _launch.spawn(self.plan, argv, cwd, dict(self.env, **extra_env), split=split)
        try:
            spawned = self._prepare(order.identity)
        except OSError as exc:
            raise OSError(f"cannot start the call's namespaces: {exc}") from exc
        # If the chain died while setting up, its status pipe says why.
        with suppress(OSError):
            _launch.start(spawned, argv, cwd, extra_env, split=split, detach=order.detach)
        return spawned

    def refill(self) -> None:
        """Prepare the next call's namespaces unless one is ready (calls on chains only)."""
        if self.spare is None and self.chains:
            # A call that finds no spare prepares its own and reports why it failed.
            with suppress(OSError):
                self.spare = self._prepare()

    def kill_init(self, pid: int) -> None:
        """Have init's parent kill it (no pid reuse there); the kernel then empties its
        namespace, and the zygote says D once it has reaped init."""
        if self.zygote is not None:
            self.zygote.kill(pid)

    def reap(self) -> None:
        """After SIGCHLD: forget a zygote that exited (the next chain starts a new one)."""
        zygote = self.zygote
        if zygote is not None and _launch.has_exited(zygote.pid):
            zygote.close()
            self.zygote = None

    def close_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.close()  # its init reads end-of-file for a request and exits

    def close(self) -> None:
        """End the zygote: its death takes every init (PDEATHSIG), and each namespace with it."""
        self.close_spare()
        if self.zygote is not None:
            self.zygote.close()

    def _prepare(self, identity: tuple[int, int] | None = None) -> _launch.Spawned:
        """Have the zygote fork a call's chain, (re)starting the zygote if it is not running.

        ``identity``: the uid and gid the call sees, for an exec that names a user.
        """
        zygote = self.zygote
        if zygote is not None:
            with suppress(OSError):
                return _launch.prepare(lambda fds: zygote.order(fds, identity))
            zygote.close()  # it died; one new zygote, then give up
        self.zygote = fresh = _zygote.start(self.plan, self.env)
        return _launch.prepare(lambda fds: fresh.order(fds, identity))

    def _start_on_spare(
        self, argv: list[str], cwd: str, extra_env: dict[str, str], split: bool, detach: bool
    ) -> _launch.Spawned | None:
        """Hand the request to the spare and return it; None if there is no live spare."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        if not _launch.chain_alive(spare):
            # Killed from outside, or it could not set itself up.
            spare.close()
            return None
        try:
            _launch.start(spare, argv, cwd, extra_env, split=split, detach=detach)
        except OSError:
            # It died before its init read the request.
            spare.close()
            return None
        return spare
