"""Promise: the environment is exactly the five documented variables, never a host secret."""

from __future__ import annotations

import pytest

from astralvessel.sandbox import Policy, Sandbox

from .calls import py, py_json

EXPECTED = {
    "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
    "LANG": "C.UTF-8",
    "HOME": "/workspace",
    "TMPDIR": "/workspace",
}


@pytest.fixture
def secret_session(backend: Sandbox, policy: Policy, host_secret_env: str):
    """A turn started while the host's environment holds a secret."""
    turn = backend.start(policy)
    try:
        yield turn
    finally:
        turn.close()


def test_environment_is_exactly_five_variables(session):
    """A call's environment is PATH, LANG, HOME, TMPDIR and VESSEL_OUTBOX with their fixed values."""
    env = py_json(session, "import json, os; print(json.dumps(dict(os.environ)))")
    # Each call has its own outbox folder inside /workspace/outbox.
    assert env.pop("VESSEL_OUTBOX").startswith("/workspace/outbox/")
    assert env == EXPECTED


def test_host_secret_not_visible(secret_session, host_secret_env):
    """A variable the host set is in no call's environment, nor in any /proc environ it can read."""
    outcome = py(
        secret_session,
        """
        import os
        print(sorted(os.environ))
        for pid in os.listdir("/proc"):
            if pid.isdigit() or pid == "self":
                try:
                    print(open(f"/proc/{pid}/environ", "rb").read())
                except OSError as exc:
                    print(pid, exc.errno)
        """,
    )
    assert outcome.exit_code == 0, outcome.output
    assert host_secret_env not in outcome.output
    assert "ASTRALVESSEL_TEST_SECRET" not in outcome.output
