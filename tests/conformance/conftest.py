"""One conformance suite, run against every confined backend.

``BACKENDS`` is the only list: Docker joins the suite by adding its name. Each
test gets a fresh turn (``session``) of the backend under test, built from a
real agent folder and a read-only data mount in ``tmp_path``, and closed after.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.sandbox import Limits, Mount, Policy, Sandbox, SandboxSession
from astralvessel.sandbox._discovery import get_backend

#: Every backend the suite runs on; a backend that cannot run here fails, never skips.
BACKENDS = ["bubblewrap", "nsjail", "docker"]

#: The workdir the test agent declares; the data folder is mounted there read-only.
WORKDIR = "/data"
#: Limits small enough that the limit tests reach them in a moment.
TEST_LIMITS = Limits(disk_mb=16, memory_mb=256, processes=48, open_files=256)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Sandbox:
    """The backend under test, found the way a host finds it: by name."""
    return get_backend(request.param)


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    """A small agent folder: a manifest and one tool script."""
    agent = tmp_path / "agent"
    (agent / "tools").mkdir(parents=True)
    (agent / "vessel.toml").write_text('name = "conformance"\nworkdir = "/data"\n')
    (agent / "tools" / "hello.py").write_text("print('hello from the agent folder')\n")
    # World-readable, as an agent folder a host ships would be.
    for path in (tmp_path, agent, agent / "tools"):
        path.chmod(0o755)
    return agent


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """The host data mounted read-only at the workdir."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "species.txt").write_text("otter\nheron\n")
    data.chmod(0o755)
    (data / "species.txt").chmod(0o644)
    return data


@pytest.fixture
def policy(agent_dir: Path, data_dir: Path) -> Policy:
    """The policy of a typical turn, with small limits."""
    return Policy(
        agent_dir=agent_dir,
        workdir=WORKDIR,
        mounts=(Mount.from_pair(WORKDIR, data_dir),),
        limits=TEST_LIMITS,
    )


@pytest.fixture
def session(backend: Sandbox, policy: Policy) -> Iterator[SandboxSession]:
    """A running turn of the backend under test, closed after the test."""
    turn = backend.start(policy)
    try:
        yield turn
    finally:
        turn.close()


@pytest.fixture
def host_secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """A secret the host process holds in its environment while the turn starts."""
    secret = f"host-secret-{os.getpid()}-{os.urandom(4).hex()}"
    monkeypatch.setenv("ASTRALVESSEL_TEST_SECRET", secret)
    return secret
