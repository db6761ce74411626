"""``Unconfined``: the sandbox server on the host itself, for trusted tools and development.

It speaks the same protocol as every confined backend, so tools behave the same,
but calls run as the host's user with the host's view of the filesystem and no
promise kept. Sandbox paths (``/workspace``, ``/agent``, the workdir and mounts)
are mapped to host folders. Never chosen automatically.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from ._base import BackendReport, Sandbox, ServerLink, ServerOptions
from ._channels import PipeChannel
from ._policy import AGENT_DIR, SANDBOX_LANG, SANDBOX_PATH, WORKSPACE_DIR, Policy, Promise
from ._session import server_command

__all__ = ["Unconfined"]

_WHY = "unconfined runs calls directly on the host, as the host's user"


def path_map_for(policy: Policy, workspace: Path) -> dict[str, str]:
    """Map each sandbox path of ``policy`` to the host folder behind it."""
    mapping = {str(WORKSPACE_DIR): str(workspace)}
    if policy.agent_dir is not None:
        mapping[str(AGENT_DIR)] = str(Path(policy.agent_dir).resolve())
    for mount in policy.mounts:
        mapping[str(mount.target)] = str(mount.source)
    return mapping


class Unconfined(Sandbox):
    """Run the sandbox server on the host's own interpreter, confining nothing."""

    name = "unconfined"
    confined = False

    def probe(self) -> BackendReport:
        """Always available; enforces no promise."""
        return BackendReport(
            name=self.name,
            available=True,
            reason="runs on the host with no confinement (never chosen automatically)",
            binary=sys.executable,
            enforced=frozenset(),
            unenforced=dict.fromkeys(Promise, _WHY),
        )

    def open(self, policy: Policy) -> ServerLink:
        """Start a server on ``sys.executable`` with a host temporary folder as the workspace."""
        workspace = Path(tempfile.mkdtemp(prefix="astralvessel-workspace-"))
        channel = PipeChannel.spawn(
            server_command(sys.executable),
            name=self.name,
            env={"PATH": SANDBOX_PATH, "LANG": SANDBOX_LANG},
            cwd=workspace,
            cleanup=lambda: shutil.rmtree(workspace, ignore_errors=True),
        )
        return ServerLink(
            channel=channel,
            options=ServerOptions(confine=False, path_map=path_map_for(policy, workspace)),
        )
