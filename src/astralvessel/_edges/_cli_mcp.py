"""The ``astralvessel mcp`` command: serve an agent folder's tools over MCP on stdio."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._cli_options import add_network_option, add_relax_option, executor_from

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``mcp`` subcommand to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "mcp",
        help="serve the agent's tools over MCP on stdin/stdout (one session, one turn)",
        description=(
            "Serve an agent folder's tools to an MCP client over stdio. The session is one "
            "turn: its calls share one sandbox and workspace. Needs the mcp extra."
        ),
    )
    parser.add_argument("agent_dir")
    parser.add_argument(
        "--backend", default=None, help="bubblewrap, nsjail, docker, unconfined, ..."
    )
    parser.add_argument(
        "--mount", action="append", default=[], metavar="SANDBOX_PATH=HOST_PATH[:rw]"
    )
    parser.add_argument("--scope", action="append", dest="scopes", metavar="S")
    add_relax_option(parser)
    add_network_option(parser)
    parser.add_argument("--name", default=None, help="the server name shown to the client")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    # Load and check everything before serving, so the host's mistakes exit 2 with one
    # clear line instead of becoming protocol errors mid-session.
    from ..agent import Agent
    from ..sandbox._policy import Mount

    try:
        from ..mcp_server import serve_stdio
    except ImportError as exc:
        print(f"astralvessel: error: {exc}", file=sys.stderr)
        return 2

    agent = Agent.load(args.agent_dir)
    mounts = [Mount.parse(text) for text in args.mount]
    executor = executor_from(args, agent, mounts)
    import asyncio  # here, not at the top: every CLI start registers this command

    asyncio.run(serve_stdio(executor, name=args.name, start_sandbox=True))
    return 0
