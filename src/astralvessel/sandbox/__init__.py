"""Sandbox backends: one ``Policy``, compiled by each backend into its own mechanism.

A backend implements ``probe`` and ``open`` (a ``Channel`` to the sandbox
server it started, see ``Sandbox``); the library owns the session on top.

Every name is imported on its first use: the backends (``Bubblewrap``, ``Nsjail``,
``Docker``, ``DockerExec``, ``Unconfined``), so importing this package never needs Docker's
SDK, and the rest, so a module that needs only ``_policy`` (the CLI's options) does not pay
for the session, asyncio and the server's modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._api import DetachedProcess as DetachedProcess
    from ._api import DetachRequest as DetachRequest
    from ._api import ExecRequest as ExecRequest
    from ._api import ExecResult as ExecResult
    from ._api import FsReply as FsReply
    from ._api import FsRequest as FsRequest
    from ._base import BackendReport as BackendReport
    from ._base import Channel as Channel
    from ._base import FileOutcome as FileOutcome
    from ._base import OutboxFile as OutboxFile
    from ._base import RunOutcome as RunOutcome
    from ._base import RunRequest as RunRequest
    from ._base import Sandbox as Sandbox
    from ._base import SandboxSession as SandboxSession
    from ._base import ServerLink as ServerLink
    from ._base import ServerOptions as ServerOptions
    from ._bwrap import Bubblewrap as Bubblewrap
    from ._channels import PipeChannel as PipeChannel
    from ._discovery import all_backends as all_backends
    from ._discovery import backend_names as backend_names
    from ._discovery import best_available as best_available
    from ._discovery import get_backend as get_backend
    from ._nsjail import Nsjail as Nsjail
    from ._policy import AGENT_DIR as AGENT_DIR
    from ._policy import OUTBOX_DIR as OUTBOX_DIR
    from ._policy import WORKSPACE_DIR as WORKSPACE_DIR
    from ._policy import Limits as Limits
    from ._policy import Mount as Mount
    from ._policy import Policy as Policy
    from ._policy import Promise as Promise
    from ._policy import Relaxations as Relaxations
    from ._session import server_command as server_command
    from ._uids import DEFAULT_UID_RANGE as DEFAULT_UID_RANGE
    from ._uids import UidRange as UidRange
    from ._unconfined import Unconfined as Unconfined
    from .docker import Docker as Docker
    from .docker import DockerExec as DockerExec

_LAZY = {
    "DetachedProcess": "._api",
    "DetachRequest": "._api",
    "ExecRequest": "._api",
    "ExecResult": "._api",
    "FsReply": "._api",
    "FsRequest": "._api",
    "BackendReport": "._base",
    "Channel": "._base",
    "FileOutcome": "._base",
    "OutboxFile": "._base",
    "RunOutcome": "._base",
    "RunRequest": "._base",
    "Sandbox": "._base",
    "SandboxSession": "._base",
    "ServerLink": "._base",
    "ServerOptions": "._base",
    "PipeChannel": "._channels",
    "all_backends": "._discovery",
    "backend_names": "._discovery",
    "best_available": "._discovery",
    "get_backend": "._discovery",
    "AGENT_DIR": "._policy",
    "OUTBOX_DIR": "._policy",
    "WORKSPACE_DIR": "._policy",
    "Limits": "._policy",
    "Mount": "._policy",
    "Policy": "._policy",
    "Promise": "._policy",
    "Relaxations": "._policy",
    "server_command": "._session",
    "DEFAULT_UID_RANGE": "._uids",
    "UidRange": "._uids",
    "Bubblewrap": "._bwrap",
    "Docker": ".docker",
    "DockerExec": ".docker",
    "Nsjail": "._nsjail",
    "Unconfined": "._unconfined",
}

__all__ = [
    "AGENT_DIR",
    "DEFAULT_UID_RANGE",
    "OUTBOX_DIR",
    "WORKSPACE_DIR",
    "BackendReport",
    "Bubblewrap",
    "Channel",
    "DetachRequest",
    "DetachedProcess",
    "Docker",
    "DockerExec",
    "ExecRequest",
    "ExecResult",
    "FileOutcome",
    "FsReply",
    "FsRequest",
    "Limits",
    "Mount",
    "Nsjail",
    "OutboxFile",
    "PipeChannel",
    "Policy",
    "Promise",
    "Relaxations",
    "RunOutcome",
    "RunRequest",
    "Sandbox",
    "SandboxSession",
    "ServerLink",
    "ServerOptions",
    "UidRange",
    "Unconfined",
    "all_backends",
    "backend_names",
    "best_available",
    "get_backend",
    "server_command",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
