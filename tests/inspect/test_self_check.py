"""inspect_ai's own sandbox self-check suite, run against the provider on every backend.

The checks are inspect's (``inspect_ai.util._sandbox.self_check``), pulled into
collection the way inspect's own provider tests do; only the ``sandbox_env``
fixture is ours. They run as inspect's own Docker sandbox runs them: as root
in a root it may write (``root_identity`` and ``writable_root``), which
``test_exec_as_user`` needs to add a user and run as it. Every check passes:
there is no declared failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - inspect's checks, collected here

from astralvessel.integrations.inspect_ai import VesselSandboxConfig, VesselSandboxEnvironment

from .conftest import BACKENDS


@pytest.fixture(params=BACKENDS)
async def sandbox_env(request: pytest.FixtureRequest) -> AsyncIterator[SandboxEnvironment]:
    """One sample's sandbox from the provider, on each backend, as inspect would open it."""
    task = f"self-check-{request.param}"
    # inspect's checks write under /tmp, which only the writable root has, and add a user.
    config = VesselSandboxConfig(backend=request.param, writable_root=True, root_identity=True)
    await VesselSandboxEnvironment.task_init(task, config)
    environments = await VesselSandboxEnvironment.sample_init(task, config, {})
    try:
        yield environments["default"]
    finally:
        await VesselSandboxEnvironment.sample_cleanup(task, config, environments, False)
        await VesselSandboxEnvironment.task_cleanup(task, config, True)
