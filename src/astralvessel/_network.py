"""A turn's allow-listed network: the egress proxy the executor starts with a turn's sandbox.

The policy says which hosts (``Policy.network_allow``); webfetch's ``Fetcher``
says by which rule addresses are judged and how names resolve (its
``EgressPolicy`` and ``Resolver``), so the network a call reaches through the
proxy and the pages webfetch reads follow one egress policy.
"""

from __future__ import annotations

from .sandbox._policy import Policy
from .web import Fetcher
from .web._proxy import EgressProxy

__all__ = ["start_proxy"]


def start_proxy(policy: Policy, fetcher: Fetcher) -> EgressProxy | None:
    """Start the turn's egress proxy when ``policy`` allows a network; None when it does not."""
    if not policy.network_allow:
        return None
    return EgressProxy.start(policy.network_allow, egress=fetcher.policy, resolver=fetcher.resolver)
