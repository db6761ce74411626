"""Whose failure a result is: the ``Outcome`` enum and the one rule that decides it.

Every ``ToolResult`` and ``ExecResult`` carries exactly one outcome, decided by
``decide`` from facts the runner already has (the command's exit, a timeout, a
limit that stopped it, a refusal, a sandbox that died, a host tool that
raised). It sits in the ground so that ``ExecResult`` (in the sandbox wing) and
``results`` (the renderer) both ask the same function. The text the model reads
does not depend on it.
"""

from __future__ import annotations

from ._kinds import TextEnum

__all__ = ["Outcome", "decide"]


class Outcome(TextEnum):
    """What happened to one call or command, and so whose failure it was."""

    #: It ran and succeeded.
    OK = "ok"
    #: It ran, and the command (or file tool, web page, service) itself failed: the model's.
    FAILED = "failed"
    #: Nothing ran: the arguments, the granted scopes or the policy refused it.
    REFUSED = "refused"
    #: It ran past its timeout and was stopped.
    TIMED_OUT = "timed_out"
    #: A bound of the turn stopped or cut it: memory, disk, output, processes.
    LIMIT = "limit"
    #: Infrastructure, not the model: the sandbox died, its backend or node failed, or a
    #: service could not be reached. Mask these in training rewards.
    SANDBOX_LOST = "sandbox_lost"
    #: A tool running in the host (a Python tool or bound service callable) raised.
    HOST_ERROR = "host_error"


def decide(
    *,
    lost: bool = False,
    refused: bool = False,
    host_error: bool = False,
    timed_out: bool = False,
    limit: bool = False,
    failed: bool = False,
) -> Outcome:
    """The outcome for these facts: the first that holds in the order of the arguments.

    The order says which fact explains the others: a sandbox that died explains
    the call's missing exit, a timeout explains its non-zero one, a memory stop
    explains the kill that followed it, and a cut output is a limit even when the
    command then exited 0.
    """
    facts = (
        (lost, Outcome.SANDBOX_LOST),
        (refused, Outcome.REFUSED),
        (host_error, Outcome.HOST_ERROR),
        (timed_out, Outcome.TIMED_OUT),
        (limit, Outcome.LIMIT),
        (failed, Outcome.FAILED),
    )
    return next((outcome for holds, outcome in facts if holds), Outcome.OK)
