"""Options the ``call`` and ``mcp`` subcommands share, so the two can never drift apart."""

from __future__ import annotations

import argparse

from .sandbox._policy import Promise

__all__ = ["add_relax_option"]


def add_relax_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--relax PROMISE`` (repeatable): the host's explicit ``Executor(relax=...)``."""
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
