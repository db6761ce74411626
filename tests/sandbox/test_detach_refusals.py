"""A detached process the server refuses: the server says why by reason, the host words it."""

from __future__ import annotations

import pytest

from astralvessel.errors import BackendUnavailableError, UsageError
from astralvessel.sandbox._replies import detached_result
from astralvessel.sandbox._session import _Pending
from astralvessel.sandbox.server import _protocol
from astralvessel.sandbox.server._calls import RunOrder, refusal


def _order(*, detach: bool) -> RunOrder:
    return RunOrder(["true"], "/", 1.0, 100, b"", detach=detach)


def test_the_server_refuses_by_reason_not_in_words():
    """The server's refusal is a reason of the protocol's: a full turn, or no namespaces."""
    bound = _protocol.DETACHED_PER_TURN
    assert refusal(_order(detach=False), chains=False, detached=bound) is None
    assert refusal(_order(detach=True), chains=True, detached=bound - 1) is None
    assert refusal(_order(detach=True), chains=True, detached=bound) == "turn_full"
    assert refusal(_order(detach=True), chains=False, detached=0) == "needs_namespaces"


@pytest.mark.parametrize(
    ("reason", "error", "words"),
    [
        ("turn_full", UsageError, "the turn already holds 8 detached processes (each counts"),
        ("needs_namespaces", BackendUnavailableError, "a detached process needs a server that"),
        ("something else", BackendUnavailableError, "something else"),
    ],
)
def test_the_host_words_each_reason_as_its_error(reason, error, words):
    """Each reason becomes its error (the host's mistake, or the backend's), in the host's words."""
    refused = detached_result(_Pending(kind="run"), {"refused": reason}, 1 << 30)
    assert type(refused) is error
    assert str(refused).startswith(words)
