"""Promise: a call that swaps the turn's outbox folder for a link cannot make the server (root
on a root host) create or hand over a folder where the link points."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.sandbox import OUTBOX_DIR, Mount, Policy, Sandbox, SandboxSession

from .calls import run
from .conftest import TEST_LIMITS

#: What a call leaves at the outbox folder's name for the next call (shell, run as the call).
SWAPS = {
    "a link to a folder": f"rm -r {OUTBOX_DIR} && ln -s /shared/locked {OUTBOX_DIR}",
    "a link to a file": f"rm -r {OUTBOX_DIR} && ln -s /shared/locked/kept {OUTBOX_DIR}",
    "a dangling link": f"rm -r {OUTBOX_DIR} && ln -s /shared/locked/gone {OUTBOX_DIR}",
    "a file": f"rm -r {OUTBOX_DIR} && echo plain > {OUTBOX_DIR}",
}


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A writable host folder holding a folder the call may not write (0755, the host's)."""
    folder = tmp_path / "shared"
    (folder / "locked").mkdir(parents=True)
    (folder / "locked" / "kept").write_text("the host's\n")
    folder.chmod(0o777)
    (folder / "locked").chmod(0o755)
    return folder


@pytest.fixture
def rw_session(backend: Sandbox, shared: Path) -> Iterator[SandboxSession]:
    """A turn with ``shared`` mounted writable at /shared."""
    turn = backend.start(
        Policy(
            workdir="/shared",
            mounts=(Mount.from_pair("/shared", shared, writable=True),),
            limits=TEST_LIMITS,
        )
    )
    try:
        yield turn
    finally:
        turn.close()


@pytest.mark.parametrize("swap", sorted(SWAPS))
def test_an_outbox_swapped_for_a_link_is_never_followed(rw_session, shared, swap):
    """After a call leaves a link (or a file) at the outbox folder's name, the next call gets
    a fresh outbox folder in the workspace that returns its files, and nothing was made,
    handed over or written where the link pointed."""
    swapped = run(rw_session, "/bin/sh", "-c", SWAPS[swap])
    assert swapped.exit_code == 0, swapped.output
    after = run(
        rw_session,
        "/bin/sh",
        "-c",
        'echo again > "$VESSEL_OUTBOX/again.txt" && cd "$VESSEL_OUTBOX" && pwd -P',
    )
    assert after.exit_code == 0, after.output
    assert after.output.splitlines()[0].startswith(f"{OUTBOX_DIR}/"), after.output
    assert [f.name for f in after.files] == ["again.txt"], after.output
    assert sorted(p.name for p in (shared / "locked").iterdir()) == ["kept"]
    assert (shared / "locked" / "kept").read_text() == "the host's\n"
