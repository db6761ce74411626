"""The network allow-list: which host names (and ports) a turn's calls may reach.

``[network] allow`` in vessel.toml and ``Executor(network_allow=...)`` are
lists of patterns in one small, strict syntax, read here and nowhere else:

- ``pypi.org``: that name, on ports 80 and 443;
- ``pypi.org:8080``: that name, on port 8080 only;
- ``*.pythonhosted.org`` (optionally ``:PORT``): any name *below* it
  (``files.pythonhosted.org``), never the name itself.

A pattern is a DNS name of at least two labels (letters, digits and hyphens;
matched case-blind), never an IP address, a URL, a path or a trailing dot: an
address in a list would bypass the name the host meant to trust, and the
egress proxy refuses IP addresses from calls for the same reason. Pure values
and functions only; both the sandbox policy and the egress proxy import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from ..errors import UsageError

__all__ = ["DEFAULT_PORTS", "HostPattern", "parse_allow_list", "permits", "read_allow_list"]

#: The ports a pattern without ``:PORT`` allows.
DEFAULT_PORTS = (80, 443)

_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})+$")
_PORT = re.compile(r"^[1-9][0-9]{0,4}$")

SYNTAX = "write a host name such as pypi.org, optionally :PORT, or *.example.org for names below it"


def _check_host(instance: HostPattern, attribute: object, host: str) -> None:
    problem = _host_problem(host)
    if problem is not None:
        raise UsageError(f"network allow pattern {host!r}: {problem}; {SYNTAX}")


def _check_port(instance: HostPattern, attribute: object, port: int | None) -> None:
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise UsageError(f"network allow port {port!r} is not a number")
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"network allow port {port} is not between 1 and 65535")


def _host_problem(host: object) -> str | None:
    if not isinstance(host, str):
        return "is not text"
    if len(host) > 253:
        return "is longer than 253 characters"
    if not _NAME.match(host):
        return "is not a lowercase DNS name of at least two labels"
    if host.rsplit(".", 1)[-1].isdigit():
        return "looks like an IP address; the list names hosts, never addresses"
    return None


@attrs.frozen(kw_only=True)
class HostPattern:
    """One allow-list entry: a host name (or every name below ``host`` when ``below``) and a port.

    ``port`` None means ports 80 and 443. Every construction path checks the
    fields, so a pattern that exists is well formed.
    """

    host: str = attrs.field(validator=_check_host)
    below: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    port: int | None = attrs.field(default=None, validator=_check_port)

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        """Read ``NAME``, ``NAME:PORT``, ``*.NAME`` or ``*.NAME:PORT``; raise ``UsageError``."""
        if not isinstance(text, str):
            raise UsageError(f"network allow pattern {text!r} is not text; {SYNTAX}")
        host, sep, port_text = text.strip().lower().partition(":")
        if sep and not _PORT.match(port_text):
            raise UsageError(
                f"network allow pattern {text!r}: the port {port_text!r} is not a number "
                f"from 1 to 65535; {SYNTAX}"
            )
        below = host.startswith("*.")
        return cls(
            host=host[2:] if below else host,
            below=below,
            port=int(port_text) if sep else None,
        )

    @property
    def ports(self) -> tuple[int, ...]:
        """The ports this pattern allows."""
        return DEFAULT_PORTS if self.port is None else (self.port,)

    def matches_name(self, host: str) -> bool:
        """Whether a canonical ``host`` is this pattern's name (on any of its ports)."""
        return host.endswith("." + self.host) if self.below else host == self.host

    def matches(self, host: str, port: int) -> bool:
        """Whether a canonical (lowercase, no trailing dot) ``host`` on ``port`` is allowed."""
        return port in self.ports and self.matches_name(host)

    def __str__(self) -> str:
        text = f"*.{self.host}" if self.below else self.host
        return text if self.port is None else f"{text}:{self.port}"


def read_allow_list(
    texts: Iterable[str | HostPattern],
) -> tuple[tuple[HostPattern, ...], list[tuple[int, str]]]:
    """Read a whole list: its patterns (each once, in order) and each bad entry's index
    and problem, so a file's reader can name every entry where it stands."""
    patterns: list[HostPattern] = []
    problems: list[tuple[int, str]] = []
    for index, text in enumerate(texts):
        if isinstance(text, HostPattern):
            patterns.append(text)
            continue
        try:
            patterns.append(HostPattern.parse(text))
        except UsageError as error:
            problems.append((index, str(error)))
    return tuple(dict.fromkeys(patterns)), problems


def parse_allow_list(texts: Iterable[str | HostPattern]) -> tuple[HostPattern, ...]:
    """Read a whole list; raise one ``UsageError`` naming every bad entry."""
    if isinstance(texts, str):
        raise UsageError(f"network allow is a list of patterns, not the text {texts!r}")
    patterns, problems = read_allow_list(texts)
    if problems:
        raise UsageError("; ".join(problem for _, problem in problems))
    return patterns


def permits(patterns: Iterable[HostPattern], host: str, port: int) -> bool:
    """Whether any pattern allows ``host`` on ``port``."""
    return any(pattern.matches(host, port) for pattern in patterns)
