"""Options the ``call`` and ``mcp`` subcommands share, so the two can never drift apart."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..sandbox._policy import Promise

if TYPE_CHECKING:
    from ..agent import Agent
    from ..executor import Executor
    from ..sandbox._policy import Mount

__all__ = ["add_network_option", "add_relax_option", "executor_from", "network_hosts"]


def add_relax_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--relax PROMISE`` (repeatable), ``--writable-root``, ``--root-identity``,
    ``--tool-servers``.

    Each is the host's explicit choice, as the ``Executor`` argument of the same name.
    """
    parser.add_argument(
        "--relax",
        action="append",
        default=[],
        choices=[promise.value for promise in Promise],
        metavar="PROMISE",
        help=(
            "give up one confinement promise, as Executor(relax=[...]) does "
            "(repeatable; `astralvessel doctor` lists them)"
        ),
    )
    # The eval relaxations: absent means the agent's [sandbox] setting.
    parser.add_argument(
        "--writable-root",
        action="store_const",
        const=True,
        default=None,
        help=(
            "make /usr, /etc, /opt, /var, ... writable for the turn: per-turn layers counted "
            "against the disk limit; the host's files never change"
        ),
    )
    parser.add_argument(
        "--root-identity",
        action="store_const",
        const=True,
        default=None,
        help="run calls as uid 0 of their own user namespace, still without any capability",
    )
    parser.add_argument(
        "--tool-servers",
        action="store_const",
        const=True,
        default=None,
        help=(
            "let calls open unix sockets and sessions within the turn, and pseudo-terminals "
            "of their own (for long-lived tool servers)"
        ),
    )


def add_network_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--network-allow PATTERN`` (repeatable) and ``--no-network``: the host's list.

    Either replaces the agent's ``[network] allow`` as ``Executor(network_allow=)`` does;
    without both, the agent's list holds.
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--network-allow",
        action="append",
        default=None,
        dest="network_allow",
        metavar="PATTERN",
        help=(
            "let calls reach this host through the egress proxy: pypi.org, pypi.org:8080 or "
            "*.example.org (repeatable; replaces the agent's [network] allow)"
        ),
    )
    group.add_argument(
        "--no-network",
        action="store_const",
        const=[],
        dest="network_allow",
        help="no network for calls, whatever the agent's [network] allow says",
    )
    parser.add_argument(
        "--network-host",
        action="append",
        default=[],
        dest="network_hosts",
        type=_host_pin,
        metavar="NAME=ADDRESS",
        help=(
            "pin a listed name to an address on the host or the local network, such as "
            "wiki.internal=10.20.0.5 (repeatable; see Executor(network_hosts=))"
        ),
    )


def _host_pin(text: str) -> tuple[str, str]:
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write NAME=ADDRESS, such as wiki.internal=10.20.0.5"
        )
    return name, address


def network_hosts(pins: list[tuple[str, str]]) -> dict[str, list[str]]:
    """``--network-host`` pins as ``Executor(network_hosts=)`` takes them (a name may repeat)."""
    hosts: dict[str, list[str]] = {}
    for name, address in pins:
        hosts.setdefault(name, []).append(address)
    return hosts


def executor_from(
    args: argparse.Namespace,
    agent: Agent,
    mounts: Sequence[Mount],
    *,
    outbox_dir: str | None = None,
) -> Executor:
    """The ``Executor`` the ``call`` and ``mcp`` subcommands run ``agent``'s tools with."""
    # Imported here, not at the top: every CLI start reads this module.
    from ..executor import Executor
    from ..registry import Registry

    return Executor(
        Registry.for_agent(agent),
        sandbox=args.backend,
        mounts=mounts,
        scopes=args.scopes,
        relax=args.relax,
        network_allow=args.network_allow,
        network_hosts=network_hosts(args.network_hosts),
        writable_root=args.writable_root,
        root_identity=args.root_identity,
        tool_servers=args.tool_servers,
        outbox_dir=outbox_dir,
    )
