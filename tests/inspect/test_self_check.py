"""inspect_ai's own sandbox self-check suite, run against the provider on every backend.

The checks are inspect's (``inspect_ai.util._sandbox.self_check``), pulled into
collection the way inspect's own provider tests do; only the ``sandbox_env``
fixture is ours. A check our sandbox cannot satisfy by design is a strict
xfail with its reason, so it fails the day it starts to pass.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - inspect's checks, collected here

from astralvessel.integrations.inspect_ai import VesselSandboxConfig, VesselSandboxEnvironment

from .conftest import BACKENDS

#: Checks the provider fails by design, with why.
KNOWN_FAILURES = {
    "test_exec_as_user": (
        "every command runs as the sandbox's one identity: there is no root that can "
        "add a user and switch to it (user= raises SandboxUserUnsupportedError)"
    ),
}


@pytest.fixture(params=BACKENDS)
async def sandbox_env(request: pytest.FixtureRequest) -> AsyncIterator[SandboxEnvironment]:
    """One sample's sandbox from the provider, on each backend, as inspect would open it."""
    reason = KNOWN_FAILURES.get(request.node.originalname)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    task = f"self-check-{request.param}"
    # inspect's checks write under /tmp, which only the writable root has.
    config = VesselSandboxConfig(backend=request.param, writable_root=True)
    await VesselSandboxEnvironment.task_init(task, config)
    environments = await VesselSandboxEnvironment.sample_init(task, config, {})
    try:
        yield environments["default"]
    finally:
        await VesselSandboxEnvironment.sample_cleanup(task, config, environments, False)
        await VesselSandboxEnvironment.task_cleanup(task, config, True)
