"""What the egress proxy refused during a call, kept bounded (pure values, no I/O).

The proxy records each refused or failed connection here; the turn drains the
record after each call and ``results.refusal_notes`` words it for the model.
However many connections a call has refused, the record holds at most
``DESTINATIONS`` destinations, each with its first reason (cut to
``REASON_CHARS``) and a count, and one count for the rest: a flood of refusals
costs the host a fixed amount of memory, whatever its length.
"""

from __future__ import annotations

import attrs

__all__ = ["DESTINATIONS", "REASON_CHARS", "Refusals", "RefusedDestination", "record"]

#: The distinct destinations one call's record names; the rest are only counted.
DESTINATIONS = 10
#: A reason's characters kept (the proxy's own reasons are shorter; a list of names may not be).
REASON_CHARS = 300


@attrs.frozen
class RefusedDestination:
    """One destination the proxy refused: where the call asked to go, why, and how often."""

    #: The host name as the request gave it; "" when the request named none the proxy could read.
    host: str
    #: The port it asked for; 0 when the request named none.
    port: int
    #: The proxy's reason, as the refused connection's reply gave it (cut to REASON_CHARS).
    reason: str
    count: int = 1


@attrs.frozen
class Refusals:
    """A call's refused connections: at most DESTINATIONS named, and a count of the others."""

    destinations: tuple[RefusedDestination, ...] = ()
    #: Refused connections to destinations past the first DESTINATIONS.
    others: int = 0

    @property
    def total(self) -> int:
        """Every refused connection recorded, named or not."""
        return self.others + sum(d.count for d in self.destinations)


def record(refusals: Refusals, host: str, port: int, reason: str) -> Refusals:
    """``refusals`` with one more refused connection to ``host:port``."""
    for index, known in enumerate(refusals.destinations):
        if (known.host, known.port) == (host, port):
            counted = attrs.evolve(known, count=known.count + 1)
            destinations = (
                *refusals.destinations[:index],
                counted,
                *refusals.destinations[index + 1 :],
            )
            return attrs.evolve(refusals, destinations=destinations)
    if len(refusals.destinations) >= DESTINATIONS:
        return attrs.evolve(refusals, others=refusals.others + 1)
    cut = reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 3] + "..."
    added = RefusedDestination(host=host[:253], port=port, reason=cut)
    return attrs.evolve(refusals, destinations=(*refusals.destinations, added))
