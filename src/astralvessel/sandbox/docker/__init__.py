"""The Docker backends as a package, one concern a module (after inspect_ai's ``docker/``).

- ``_backend``: ``Docker`` and ``DockerExec`` (probe, start, sweep);
- ``_engine``: the SDK client, images and builds, containers, leftovers;
- ``_attach``: the engine's multiplexed streams and the attach ``Channel``;
- ``_direct``: the direct ``Channel``, a unix socket of the turn's own;
- ``_spec``: what a turn's container looks like, as pure functions of a ``Policy``;
- ``_cow``: a workspace opened from a snapshot copy-on-write, the host's overlay (root);
- ``_exec_session``: the ``docker-exec`` session, one ``docker exec`` per call.

Importing this package never imports the Docker SDK; the first turn does.
"""

from __future__ import annotations

from ._backend import DEFAULT_BASE_IMAGE as DEFAULT_BASE_IMAGE
from ._backend import Docker as Docker
from ._backend import DockerExec as DockerExec

__all__ = ["DEFAULT_BASE_IMAGE", "Docker", "DockerExec"]
