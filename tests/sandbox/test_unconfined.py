"""The Unconfined backend: the same server on the host, sandbox paths mapped to host folders."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from astralvessel.errors import BackendUnavailableError
from astralvessel.sandbox._base import RunRequest, ServerLink
from astralvessel.sandbox._policy import Mount, Policy, Promise
from astralvessel.sandbox._unconfined import Unconfined
from tests.conformance.calls import file_tool


def test_probe_is_available_and_enforces_nothing() -> None:
    """Unconfined is always available, never chosen automatically, and keeps no promise."""
    report = Unconfined().probe()
    assert report.available
    assert report.name == "unconfined"
    assert not Unconfined.confined
    assert report.enforced == frozenset()
    assert set(report.unenforced) == set(Promise)


def test_calls_see_mapped_paths(tmp_path: Path) -> None:
    """The workdir, /agent and mounts are the host folders behind them; the workspace is writable."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "tool.sh").write_text("echo agent tool")
    data = tmp_path / "data"
    data.mkdir()
    (data / "fish.txt").write_text("trout\n")
    policy = Policy(agent_dir=agent, workdir="/data", mounts=[Mount.from_pair("/data", data)])
    session = Unconfined().start(policy)
    try:
        outcome = session.run(
            RunRequest(argv=["sh", "/agent/tool.sh"], timeout=10, output_chars=1000)
        )
        assert outcome.output == "agent tool\n"
        outcome = session.run(
            RunRequest(
                argv=["sh", "-c", "cat fish.txt; echo made > $HOME/new; cat $HOME/new"],
                timeout=10,
                output_chars=1000,
            )
        )
        assert outcome.output == "trout\nmade\n"
        listing = file_tool(session, "list", {"path": "/data"}, timeout=10)
        assert "fish.txt" in listing.text
    finally:
        session.close()


def test_workspace_is_removed_at_close() -> None:
    """Closing the session removes its host workspace folder."""
    session = Unconfined().start(Policy())
    outcome = session.run(
        RunRequest(argv=["sh", "-c", "echo $HOME"], timeout=10, output_chars=1000)
    )
    workspace = Path(outcome.output.strip())
    assert workspace.is_dir()
    session.close()
    assert not workspace.exists()


def test_unconfined_refuses_the_eval_relaxations() -> None:
    """Unconfined runs calls as the host user with no namespaces: it refuses both relaxations."""
    import pytest

    from astralvessel.errors import BackendUnavailableError

    for asked in ({"writable_root": True}, {"root_identity": True}):
        with pytest.raises(BackendUnavailableError, match=next(iter(asked))):
            Unconfined().start(Policy(**asked)).close()  # type: ignore[arg-type]


def test_a_sandbox_that_fails_to_settle_closes_its_ready_server() -> None:
    """A backend whose start fails after its server came up (``ServerLink.settle`` raises, as a
    Docker engine refusing the start it was still answering) raises that, its session closed."""
    started = []

    class Refusing(Unconfined):
        def open(self, policy: Policy) -> ServerLink:
            link = super().open(policy)
            started.append(link.channel)

            def refuse() -> None:
                raise BackendUnavailableError("the engine refused to start it after all")

            return attrs.evolve(link, settle=refuse)

    with pytest.raises(BackendUnavailableError, match="after all"):
        Refusing().start(Policy())
    assert len(started) == 1
    assert started[0].process.poll() is not None  # the session closed: its server is gone
