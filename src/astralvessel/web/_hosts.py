"""Names the operator pins to addresses: a service on the host or the local network, by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._egress import Resolver

__all__ = ["HostsResolver"]


class HostsResolver:
    """Answers the operator's pinned names from its table, every other name from ``fallback``.

    Like a hosts file: ``wiki.internal`` is whatever address the operator wrote,
    never what a DNS server says, so no answer from outside can move it.
    """

    def __init__(self, hosts: Mapping[str, Sequence[str]], fallback: Resolver) -> None:
        self.hosts = {
            name.lower().rstrip("."): tuple(addresses) for name, addresses in hosts.items()
        }
        self.fallback = fallback

    def resolve(self, host: str, port: int) -> Sequence[str]:
        """The pinned addresses of ``host``, or the fallback's answer for any other name."""
        pinned = self.hosts.get(host.lower().rstrip("."))
        return pinned if pinned is not None else self.fallback.resolve(host, port)
