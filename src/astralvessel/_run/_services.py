"""The service-tool runner: one HTTP POST to the operator's service through a web `Transport`.

A service tool (``service = "NAME"`` in its tool file) sends
``{"tool": ..., "arguments": {...}}`` to ``[services.NAME] url`` with the
tool's timeout. Service URLs are the operator's own, so the public-address
egress rule does not apply to them; redirects are never followed, and at most
``MAX_BODY_BYTES`` of a response are read. The exchange is the transport's;
this module builds the request, reads the body as it streams in (keeping only
what the model can see) and hands it to ``results.render_service_reply``.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs

from .._calls._plans import Call, Plan, TurnContext
from ..errors import ConfigError
from ..results import ToolResult, render_service_reply, render_timeout, render_unreachable
from ..web import AsyncTransport, HttpRequest, SystemResolver, Transport, _flow
from ..web._exchange import AsyncExchangeIO, Close, ExchangeIO, Read, Resolve, Send

if TYPE_CHECKING:
    from ..sandbox._base import SandboxSession
    from ..spec import ToolSpec

__all__ = ["ERROR_BODY_CHARS", "MAX_BODY_BYTES", "plan_post"]

#: The most of one service response the host reads; the rest is not fetched.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: How much of a failed response's body the error text quotes.
ERROR_BODY_CHARS = 500


@attrs.frozen(kw_only=True)
class _Target:
    service: str
    scheme: str
    host: str
    port: int
    path: str


def _target(service_urls: Mapping[str, str], spec: ToolSpec) -> _Target:
    name = spec.service or ""
    url = service_urls.get(name)
    if url is None:
        raise ConfigError(
            [
                f"service tool {spec.name!r} posts to service {name!r}, which has no "
                f"[services.{name}] url in vessel.toml; add one, or bind a callable with "
                f"Executor(services={{{name!r}: function}})"
            ]
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError([f"services.{name}.url: {url!r} must be an http:// or https:// URL"])
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(
        service=name,
        scheme=parts.scheme,
        host=parts.hostname,
        port=parts.port or (443 if parts.scheme == "https" else 80),
        path=path,
    )


def plan_post(context: TurnContext, spec: ToolSpec, call: Call) -> Plan[Any]:
    """Post the call to the service its spec names; raise ``ConfigError`` if it has no URL."""
    payload = json.dumps({"tool": call.tool, "arguments": dict(call.arguments)}, ensure_ascii=False)
    return ServicePost(
        target=_target(context.service_urls, spec),
        payload=payload.encode("utf-8"),
        timeout=call.timeout,
        transport=context.transport,
        body=_Body(output_chars=context.output_chars),
    )


class _Body:
    """A response body decoded as it streams in: at most ``keep`` characters kept, the rest counted.

    An error response only needs a short quote, so its reading stops once that is kept.
    """

    def __init__(self, *, output_chars: int) -> None:
        self.output_chars = output_chars
        self.status = 0
        self.reason = ""
        self.keep = output_chars
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0
        self.read = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def start(self, status: int, reason: str) -> None:
        """The response head arrived: a failed one is only quoted."""
        self.status, self.reason = status, reason
        self.keep = self.output_chars if self.ok else ERROR_BODY_CHARS

    def feed(self, data: bytes, *, final: bool = False) -> bool:
        """Take one chunk; return False when reading should stop."""
        self.read += len(data)
        piece = self._decoder.decode(data, final=final)
        room = max(0, self.keep - self.kept)
        if room:
            self.parts.append(piece[:room])
            self.kept += min(room, len(piece))
        self.dropped += max(0, len(piece) - room)
        return self.read < MAX_BODY_BYTES and (self.ok or self.kept < self.keep)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _address(addresses: Sequence[str]) -> str:
    if not addresses:
        raise OSError("the name resolved to no address")
    return addresses[0]


# The web package's resolver, with no egress check: service URLs are the operator's.
_resolver = SystemResolver()


@attrs.frozen(kw_only=True)
class ServicePost:
    """One POST: resolve, send, read the body into ``body``, as one flow (``web._flow``) that
    ``run`` and ``arun`` drive; only the waiting differs."""

    target: _Target
    payload: bytes
    timeout: float
    transport: Transport | AsyncTransport
    #: Filled as the response arrives, so a timeout can still show what came.
    body: _Body
    sandboxed: bool = attrs.field(default=False, init=False)

    def _request(self, addresses: Sequence[str], deadline: float) -> HttpRequest:
        target = self.target
        return HttpRequest(
            method="POST",
            scheme=target.scheme,
            host=target.host,
            address=_address(addresses),
            port=target.port,
            target=target.path,
            headers=(
                ("Content-Type", "application/json"),
                ("Accept", "text/plain, application/json, */*"),
                # The transport hands back the raw body; ask for it unencoded.
                ("Accept-Encoding", "identity"),
                ("User-Agent", "astralvessel"),
            ),
            body=self.payload,
            deadline=deadline,
        )

    def run(self, session: SandboxSession | None) -> _Body:
        transport = self.transport
        if not isinstance(transport, Transport):
            raise TypeError(f"{type(transport).__name__} has no send(); use acall() with it")
        return _flow.run(self._flow(), ExchangeIO(transport, _resolver).perform)

    async def arun(self, session: SandboxSession | None) -> _Body:
        # A sync-only transport's steps run in worker threads, each bounded by the deadline.
        return await _flow.arun(self._flow(), AsyncExchangeIO(self.transport, _resolver).perform)

    def _flow(self) -> _flow.Flow[_Body]:
        """The one post, as steps both drivers perform: the lookup is bounded by the deadline
        in both (a lookup cannot be stopped: a late one finishes alone, its answer dropped)."""
        target, body = self.target, self.body
        deadline = time.monotonic() + self.timeout
        addresses = yield from Resolve(target.host, target.port, deadline)
        response = yield from Send(self._request(addresses, deadline))
        try:
            body.start(response.status, response.reason)
            while (chunk := (yield from Read())) is not None:
                if not body.feed(chunk):
                    break
            else:
                body.feed(b"", final=True)
        finally:
            yield from Close()
        return body

    def finish(self, outcome: _Body) -> ToolResult:
        return render_service_reply(
            self.target.service,
            status=outcome.status,
            reason=outcome.reason,
            text=outcome.text,
            dropped_chars=outcome.dropped,
            cap=outcome.output_chars,
        )

    def rescue(self, exc: Exception) -> ToolResult | None:
        if isinstance(exc, TimeoutError):
            body = self.body
            return render_timeout(body.text, timeout=self.timeout, dropped_chars=body.dropped)
        if isinstance(exc, OSError):
            return render_unreachable(self.target.service, exc)
        return None
