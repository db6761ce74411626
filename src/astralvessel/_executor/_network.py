"""A turn's allow-listed network: the egress proxy the executor starts with a turn's sandbox.

The policy says which hosts (``Policy.network_allow``); webfetch's ``Fetcher``
says by which rule addresses are judged and how names resolve (its
``EgressPolicy`` and ``Resolver``), so the network a call reaches through the
proxy and the pages webfetch reads follow one egress policy.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import attrs

from .._ground._netallow import HostPattern
from ..sandbox._base import Sandbox, SandboxSession
from ..sandbox._policy import Policy
from ..web import AllowRule, EgressPolicy, Fetcher
from ..web._hosts import HostsResolver
from ..web._proxy import EgressProxy

__all__ = ["WarmNetwork", "admit_hosts", "start_proxy", "start_sandbox"]


def admit_hosts(
    fetcher: Fetcher, hosts: Mapping[str, Sequence[str]], allow: Sequence[HostPattern]
) -> Fetcher:
    """``fetcher`` with the operator's pinned names: each resolves to its addresses, and an
    ``AllowRule`` admits exactly those addresses on the ports the allow-list gives the name.

    This is the one way to let a turn reach a service on the host or the local network by
    name (``Executor(network_hosts=...)``): the name must be listed, the address is the
    operator's (no DNS answer can move it), and nothing else on that network is admitted.
    """
    if not hosts:
        return fetcher
    rules = [
        AllowRule(
            network=address,
            ports=sorted(
                {p for pattern in allow if pattern.matches_name(name) for p in pattern.ports}
            ),
        )
        for name, addresses in hosts.items()
        for address in addresses
    ]
    return Fetcher(
        EgressPolicy(allow=(*fetcher.policy.allow, *rules)),
        transport=fetcher.transport,
        resolver=HostsResolver(hosts, fetcher.resolver),
        limits=fetcher.limits,
        user_agent=fetcher.user_agent,
    )


def start_proxy(policy: Policy, fetcher: Fetcher) -> EgressProxy | None:
    """Start the turn's egress proxy when ``policy`` allows a network; None when it does not."""
    if not policy.network_allow:
        return None
    return EgressProxy.start(policy.network_allow, egress=fetcher.policy, resolver=fetcher.resolver)


def start_sandbox(sandbox: Sandbox, policy: Policy, proxy: EgressProxy) -> SandboxSession:
    """Start a sandbox reaching calls to ``proxy``, which then admits its uid and no other."""
    session = sandbox.start(attrs.evolve(policy, egress_socket=proxy.socket_path))
    try:
        proxy.admit(session.peer_uid)
    except BaseException:
        session.close()
        raise
    return session


class WarmNetwork:
    """Starts a warm sandbox together with the egress proxy of the turn that will take it.

    A warm pool's hooks: ``start`` starts a proxy, then the sandbox bound to it;
    ``claim`` hands a taken sandbox's proxy to its turn; ``discard`` closes a
    sandbox no turn took, with its proxy. It holds no reference to the executor,
    so an executor nobody closed is still collected (and its pool closed).
    """

    def __init__(self, sandbox: Sandbox, policy: Policy, fetcher: Fetcher) -> None:
        self.sandbox = sandbox
        self.policy = policy
        self.fetcher = fetcher
        self._lock = threading.Lock()
        self._proxies: dict[int, EgressProxy] = {}

    def start(self) -> SandboxSession:
        """A sandbox for the policy, reaching calls to a proxy of its own."""
        proxy = EgressProxy.start(
            self.policy.network_allow, egress=self.fetcher.policy, resolver=self.fetcher.resolver
        )
        try:
            session = start_sandbox(self.sandbox, self.policy, proxy)
        except BaseException:
            proxy.close()
            raise
        with self._lock:
            self._proxies[id(session)] = proxy
        return session

    def claim(self, session: SandboxSession) -> EgressProxy | None:
        """The proxy of a sandbox a turn took; from now on the turn closes it."""
        with self._lock:
            return self._proxies.pop(id(session), None)

    def discard(self, session: SandboxSession) -> None:
        """Close a sandbox no turn took, and its proxy."""
        session.close()
        proxy = self.claim(session)
        if proxy is not None:
            proxy.close()
