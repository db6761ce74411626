"""The fake sandbox's files: a few in-memory files laid out as the sandbox would show them.

The files are written to a private temporary folder when a fake turn starts and
served by the sandbox server's own file-tool code (``sandbox/server/_files``),
through the same path map the ``unconfined`` backend uses. So ``read``,
``glob`` and ``list`` answer a fake turn word for word as they answer a real
one: the same numbering, limits, refusals and messages. A visible root that
holds no in-memory file shows what it would show in a real sandbox: the
agent folder and the host's mounted folders as they are, the workspace (and
an unmounted workdir) empty, the system directories empty, so a fake turn
never reads the host's own ``/etc`` or ``/usr``.
"""

from __future__ import annotations

import posixpath
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..sandbox._policy import AGENT_DIR, OUTBOX_DIR, WORKSPACE_DIR, Policy
from ..sandbox.server import _files, _fsops

__all__ = ["FakeFiles", "check_file_paths", "check_visible"]


def check_file_paths(files: Mapping[str, str | bytes]) -> dict[str, bytes]:
    """The files as absolute, normalised sandbox paths to bytes; ``UsageError`` for a bad one."""
    clean: dict[str, bytes] = {}
    for path, content in files.items():
        if not isinstance(path, str) or not path.startswith("/"):
            raise UsageError(f"a fake file's path is an absolute sandbox path, not {path!r}")
        norm = posixpath.normpath(path)
        if norm == "/" or ".." in norm.split("/"):
            raise UsageError(f"{path!r} cannot be a fake file's path")
        data = content.encode("utf-8") if isinstance(content, str) else content
        if not isinstance(data, bytes):
            raise UsageError(f"the fake file {path} holds str or bytes, not {type(data).__name__}")
        clean[norm] = data
    return clean


def check_visible(policy: Policy, files: Mapping[str, bytes]) -> list[str]:
    """The policy's visible roots; ``UsageError`` if a fake file lies under none of them."""
    roots = [str(root) for root in policy.visible_roots]
    for path in files:
        if not any(_under(path, root) for root in roots):
            raise UsageError(
                f"the fake file {path} is outside what the sandbox shows "
                f"({', '.join(roots)}); put it under the workdir, a mount or /workspace"
            )
    return roots


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class FakeFiles:
    """One fake turn's filesystem: a temporary folder and the path map that shows it."""

    def __init__(self, policy: Policy, files: Mapping[str, bytes]) -> None:
        roots = check_visible(policy, files)
        self.policy = policy
        self.root = Path(tempfile.mkdtemp(prefix="astralvessel-fake-"))
        for path, content in files.items():
            real = self.root / path.lstrip("/")
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_bytes(content)
        sources: dict[str, str] = {str(m.target): str(m.source) for m in policy.mounts}
        if policy.agent_dir is not None:
            sources[str(AGENT_DIR)] = str(Path(policy.agent_dir).resolve())
        self.path_map: dict[str, str] = {}
        for root in roots:
            # In-memory files replace what the host would mount there; the workspace is always ours.
            ours = root == str(WORKSPACE_DIR) or any(_under(p, root) for p in files)
            if not ours and root in sources:
                self.path_map[root] = sources[root]
            else:
                # Each root its own folder: the file tools map real paths back to sandbox paths.
                real = self.root / root.lstrip("/")
                real.mkdir(parents=True, exist_ok=True)
                self.path_map[root] = str(real)
        self.outbox = Path(self.path_map[str(WORKSPACE_DIR)]) / OUTBOX_DIR.relative_to(
            WORKSPACE_DIR
        )
        self.outbox.mkdir(parents=True, exist_ok=True)

    def real_path(self, path: str) -> str:
        """The real path behind a sandbox path (longest mapped prefix), or the path itself."""
        for prefix in sorted(self.path_map, key=len, reverse=True):
            if _under(path, prefix):
                return self.path_map[prefix].rstrip("/") + path[len(prefix.rstrip("/")) :]
        return path

    def _context(self, timeout: float) -> _files.FileContext:
        context = _files.FileContext(
            workdir=self.real_path(str(self.policy.workdir)),
            visible_roots=[self.real_path(str(r)) for r in self.policy.visible_roots],
            deadline=time.monotonic() + timeout,
            timeout=timeout,
            path_map=self.path_map,
        )
        # What the real worker is told: where the host's write_file may write.
        context.writable_roots = [  # type: ignore[attr-defined]
            self.real_path(str(r)) for r in self.policy.writable_roots
        ]
        return context

    def view(self, view: str, arguments: Mapping[str, object], timeout: float) -> tuple[str, bool]:
        """Render a file tool's view (``lines``, ``find``, ``entries``) with the server's code."""
        args: dict[str, Any] = dict(arguments)
        path = args.get("path")
        if isinstance(path, str) and path.startswith("/"):
            args["path"] = self.real_path(posixpath.normpath(path))
        return _files.handle(view, args, self._context(timeout))

    def fs(
        self, header: dict[str, Any], body: bytes, timeout: float
    ) -> tuple[dict[str, Any], bytes]:
        """Answer a host's file primitive (read, write, list) with the server's own code."""
        path = header.get("path")
        if isinstance(path, str) and path.startswith("/"):
            header = dict(header, path=self.real_path(posixpath.normpath(path)))
        return _fsops.handle(header, body, self._context(timeout))

    def close(self) -> None:
        """Remove the temporary folder."""
        shutil.rmtree(self.root, ignore_errors=True)
