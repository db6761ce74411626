"""inspect_ai's own sandbox self-check suite, run against the provider on every backend.

The checks are inspect's (``inspect_ai.util._sandbox.self_check``), pulled into
collection the way inspect's own provider tests do; only the ``sandbox_env``
fixture is ours. They run twice per backend, in a root they may write (they
write under /tmp): as root (``root_identity``), as inspect's own Docker
sandbox runs them, where every check passes; and as the calls' ordinary user,
the provider's default identity, where only the checks that need root to add
a user and run as it fail, each declared below as a strict xfail.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - inspect's checks, collected here

from astralvessel.integrations.inspect_ai import VesselSandboxConfig, VesselSandboxEnvironment

from .conftest import BACKENDS

#: The checks that cannot pass without ``root_identity``, and why: each is a strict xfail
#: there, so a check that starts passing (or a new one that fails) is seen.
NEEDS_ROOT = {
    "test_exec_as_user": "adds a user with adduser (root only) and runs as it (user= needs "
    "root_identity)",
}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend's name; ids carry it, so CI's backend filter applies."""
    return str(request.param)


@pytest.fixture(params=["root", "nobody"])
async def sandbox_env(
    request: pytest.FixtureRequest, backend: str
) -> AsyncIterator[SandboxEnvironment]:
    """One sample's sandbox from the provider, as root or as the ordinary user, as inspect
    would open it."""
    as_root = request.param == "root"
    check = request.node.originalname
    if not as_root and check in NEEDS_ROOT:
        request.applymarker(pytest.mark.xfail(strict=True, reason=NEEDS_ROOT[check]))
    task = f"self-check-{backend}-{request.param}"
    config = VesselSandboxConfig(backend=backend, writable_root=True, root_identity=as_root)
    await VesselSandboxEnvironment.task_init(task, config)
    environments = await VesselSandboxEnvironment.sample_init(task, config, {})
    try:
        yield environments["default"]
    finally:
        await VesselSandboxEnvironment.sample_cleanup(task, config, environments, False)
        await VesselSandboxEnvironment.task_cleanup(task, config, True)
