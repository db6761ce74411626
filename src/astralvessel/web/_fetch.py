"""The `Fetcher`: the policy's shell around a transport, and what `webfetch` calls.

Per hop it checks the URL, resolves the host once, approves every address,
and asks the transport for one exchange with the approved address; it follows
at most five redirects (each a new hop, checked from scratch), reads at most
4 MB after decompression, and stops at one deadline for the whole fetch.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from urllib.parse import urljoin

import attrs

from .._ground._urlrefusals import UrlRefused, redirected_words, url_refusal_words
from .._ground._webfailures import failure_words, fetch_failure_words
from .._ground._weblimits import (
    FETCH_MAX_BYTES,
    FETCH_MAX_HEADER_BYTES,
    FETCH_MAX_REDIRECTS,
    FETCH_TIMEOUT_SECONDS,
)
from .._ground._webwords import NO_READABLE_TEXT, page_head, page_notes
from ..errors import EgressError, FetchFailed, FetchWhy, SearchFailed, UsageError
from ._content import ACCEPT, ACCEPT_ENCODING, BodyCollector, ContentRefused, Fenced, render
from ._egress import Approval, EgressPolicy, Resolver, SystemResolver, Target
from ._exchange import AsyncExchangeIO, Close, ExchangeIO, Head, Resolve, Send, read_body
from ._flow import Flow, arun, run
from ._links import LINK_STYLES, LinkStyle, with_targets
from ._stdlib import StdlibTransport
from ._transport import AsyncTransport, HttpRequest, Transport

__all__ = ["FetchLimits", "Fetcher", "WebResult"]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Errors that mean "this address did not answer", so the next approved address may be tried.
_TRY_NEXT = frozenset(
    {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}
)
try:
    _VERSION = version("astralvessel")
except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
    _VERSION = "0"


@attrs.frozen(kw_only=True)
class WebResult:
    """What a web tool returns: ``text`` exactly as the model sees it, and ``is_error``."""

    text: str
    #: The fields ``text`` was framed from, when it holds untrusted text: the renderer
    #: cuts the text inside the fence from these, never by reading ``text`` back.
    fenced: Fenced | None = None
    is_error: bool = False
    url: str | None = None  # the final URL, after redirects
    status: int | None = None
    #: The reason phrase of the status line ("Not Found"), as the server sent it.
    reason: str = ""
    content_type: str | None = None
    truncated: bool = False
    #: The bytes webfetch read before it stopped (its ``max_bytes``), when it cut the page.
    stopped_at: int | None = None
    #: Nothing was sent: the arguments or the egress policy refused the call itself (an
    #: error all the same). A redirect the policy refuses is not: the first page answered.
    refused: bool = False
    #: Why the egress rule refused the URL or an address, by code (``text`` is its words).
    egress: UrlRefused | None = None
    #: Why the fetch or the search failed or did not run, by code (``text`` is its words).
    failed: FetchFailed | SearchFailed | None = None

    @classmethod
    def failure(
        cls, failed: FetchFailed | SearchFailed, *, url: str | None = None, refused: bool = False
    ) -> WebResult:
        """An error result for ``failed``, its text the code's words."""
        text = failure_words(failed)
        return cls(text=text, is_error=True, url=url, refused=refused, failed=failed)


def _redirected(error: EgressError, origin: str, url: str) -> EgressError:
    """``error`` met on a redirect from ``origin`` to ``url``: the same refusal, saying so."""
    if error.refused is None:  # an error raised with a message alone
        return EgressError(redirected_words(origin, url, str(error)))
    refused = attrs.evolve(error.refused, origin=origin, url=url)
    return EgressError(url_refusal_words(refused), refused=refused)


@attrs.frozen(kw_only=True)
class FetchLimits:
    """How far one fetch may go; the defaults are the spec's."""

    max_bytes: int = FETCH_MAX_BYTES
    timeout_seconds: float = FETCH_TIMEOUT_SECONDS
    max_redirects: int = FETCH_MAX_REDIRECTS
    max_header_bytes: int = FETCH_MAX_HEADER_BYTES

    def __attrs_post_init__(self) -> None:
        if self.max_bytes <= 0 or self.timeout_seconds <= 0 or self.max_redirects < 0:
            raise UsageError("fetch limits must be positive (max_redirects may be 0)")


class _Failure(Exception):
    """A fetch failed for the reason ``failed`` names (the message is its words)."""

    def __init__(self, failed: FetchFailed) -> None:
        super().__init__(fetch_failure_words(failed))
        self.failed = failed


class Fetcher:
    """Fetches a public page as text for a model, behind an `EgressPolicy`.

    ``transport`` performs the HTTP exchanges (the stdlib one by default);
    ``resolver`` answers DNS (``getaddrinfo`` by default), once per hop.
    An HTML page becomes its main content (its article) when it has one the
    extractor is sure of, and the whole page otherwise; ``main_content=False``
    returns every page whole, as a call's ``full_page`` does for one page.
    ``links`` says how links are written: ``"text"`` (the text alone, the
    default: targets cost the reader words on every page and are followed on
    few), ``"references"`` (the text, then ``[N]``, with the numbered targets
    listed at the end) or ``"inline"`` (Markdown ``[text](target)``). A call's
    ``link_targets`` asks for the targets of one page: as references when the
    host's style leaves them out.
    Refusals and failures come back as a `WebResult` with ``is_error`` set;
    only a misconfigured host (a transport without ``send`` for ``fetch``, a
    wrong setting) raises.
    """

    def __init__(
        self,
        policy: EgressPolicy | None = None,
        transport: Transport | AsyncTransport | None = None,
        *,
        resolver: Resolver | None = None,
        limits: FetchLimits | None = None,
        user_agent: str | None = None,
        main_content: bool = True,
        links: LinkStyle = "text",
    ) -> None:
        if not isinstance(main_content, bool):
            raise UsageError(f"main_content is True or False, not {main_content!r}")
        if links not in LINK_STYLES:
            choices = ", ".join(repr(style) for style in LINK_STYLES)
            raise UsageError(f"links is one of {choices}, not {links!r}")
        self.main_content = main_content
        self.links: LinkStyle = links
        self.policy = policy if policy is not None else EgressPolicy()
        self.transport = transport if transport is not None else StdlibTransport()
        self.resolver = resolver if resolver is not None else SystemResolver()
        self.limits = limits if limits is not None else FetchLimits()
        self.user_agent = user_agent or f"astralvessel/{_VERSION} (webfetch)"

    # -- shared decisions -------------------------------------------------------------------

    def _request(self, approval: Approval, address: str, deadline: float) -> HttpRequest:
        target = approval.target
        return HttpRequest(
            method="GET",
            scheme=target.scheme,
            host=target.host,
            address=address,
            port=target.port,
            target=target.request_target,
            headers=(
                ("User-Agent", self.user_agent),
                ("Accept", ACCEPT),
                ("Accept-Encoding", ACCEPT_ENCODING),
            ),
            deadline=deadline,
            max_header_bytes=self.limits.max_header_bytes,
        )

    def _next_url(
        self, current: str, hop: int, status: int, headers: Sequence[tuple[str, str]]
    ) -> str | None:
        if status not in _REDIRECTS:
            return None
        location = next((v for k, v in headers if k.lower() == "location"), None)
        if not location:
            return None
        if hop >= self.limits.max_redirects:
            raise _Failure(
                FetchFailed(
                    why=FetchWhy.REDIRECTS,
                    url=urljoin(current, location.strip()),
                    count=self.limits.max_redirects,
                )
            )
        return urljoin(current, location.strip()).partition("#")[0]

    def _check(self, url: str, origin: str | None) -> Target:
        try:
            return self.policy.check_url(url)
        except EgressError as error:
            if origin is None:
                raise
            raise _redirected(error, origin, url) from None

    def _approve(self, target: Target, answers: Sequence[str], origin: str | None) -> Approval:
        try:
            return self.policy.approve(target, answers)
        except EgressError as error:
            if origin is None:
                raise
            raise _redirected(error, origin, target.url) from None

    def _collector(self, headers: Sequence[tuple[str, str]]) -> BodyCollector:
        encoding = ", ".join(v for k, v in headers if k.lower() == "content-encoding") or None
        return BodyCollector.for_encoding(encoding, self.limits.max_bytes)

    def _result(
        self,
        url: str,
        status: int,
        reason: str,
        headers: Sequence[tuple[str, str]],
        body: BodyCollector,
        *,
        full_page: bool,
        link_targets: bool,
    ) -> WebResult:
        content_type = next((v for k, v in headers if k.lower() == "content-type"), None)
        main_content = self.main_content and not full_page
        links = with_targets(self.links) if link_targets else self.links
        text = render(body.body(), content_type, url, main_content=main_content, links=links)
        stopped_at = self.limits.max_bytes if body.truncated else None
        is_error = status >= 300
        readable = text if text.strip() else NO_READABLE_TEXT
        head, notes = page_head(status, reason, is_error=is_error), page_notes(stopped_at)
        fenced = Fenced.of(url, readable, head=head, notes=notes)
        return WebResult(
            text=fenced.text,
            fenced=fenced,
            is_error=is_error,
            url=url,
            status=status,
            reason=reason,
            content_type=content_type,
            truncated=body.truncated,
            stopped_at=stopped_at,
        )

    def _error(self, url: str, error: BaseException, *, first_hop: bool) -> WebResult:
        if isinstance(error, EgressError):
            refused = first_hop
            return WebResult(
                text=str(error), is_error=True, url=url, refused=refused, egress=error.refused
            )
        return WebResult.failure(self._failed(url, error), url=url)

    def _failed(self, url: str, error: BaseException) -> FetchFailed:
        """Why the fetch of ``url`` failed with ``error``, by code."""
        if isinstance(error, _Failure):
            return error.failed
        if isinstance(error, ContentRefused):
            return FetchFailed(why=FetchWhy.UNREADABLE, url=url, content=error.refusal)
        if isinstance(error, TimeoutError | asyncio.TimeoutError):
            return FetchFailed(why=FetchWhy.TIMEOUT, url=url, seconds=self.limits.timeout_seconds)
        detail = getattr(error, "strerror", None) or str(error) or type(error).__name__
        return FetchFailed(why=FetchWhy.UNREACHABLE, url=url, detail=str(detail))

    # -- the one fetch flow, and its two drivers ---------------------------------------------

    def fetch(self, url: str, *, full_page: bool = False, link_targets: bool = False) -> WebResult:
        """Fetch ``url`` and return its text wrapped as untrusted, or an error result.

        ``full_page`` returns an HTML page whole, not its main content;
        ``link_targets`` writes its links' targets when the host's ``links`` leaves them out.
        """
        if not isinstance(self.transport, Transport):
            raise TypeError(f"{type(self.transport).__name__} has no send(); use afetch() with it")
        flow = self._flow(url, full_page, link_targets)
        return run(flow, ExchangeIO(self.transport, self.resolver).perform)

    async def afetch(
        self, url: str, *, full_page: bool = False, link_targets: bool = False
    ) -> WebResult:
        """The async twin of `fetch`: the same flow, its steps awaited."""
        flow = self._flow(url, full_page, link_targets)
        return await arun(flow, AsyncExchangeIO(self.transport, self.resolver).perform)

    def _flow(self, url: str, full_page: bool, link_targets: bool) -> Flow[WebResult]:
        deadline = time.monotonic() + self.limits.timeout_seconds
        current, origin = url, None
        try:
            for hop in range(self.limits.max_redirects + 1):
                target = self._check(current, origin)
                answers = yield from self._resolve(target, deadline)
                approval = self._approve(target, answers, origin)
                response = yield from self._send(approval, deadline)
                try:
                    following = self._next_url(current, hop, response.status, response.headers)
                    if following is None:
                        collector = self._collector(response.headers)
                        yield from read_body(collector, deadline)
                        return self._result(
                            current,
                            response.status,
                            response.reason,
                            response.headers,
                            collector,
                            full_page=full_page,
                            link_targets=link_targets,
                        )
                finally:
                    yield from Close()
                current, origin = following, current
        except (OSError, EgressError, ContentRefused, _Failure, asyncio.TimeoutError) as error:
            return self._error(current, error, first_hop=origin is None)
        raise AssertionError("unreachable: the redirect loop always returns")  # pragma: no cover

    def _resolve(self, target: Target, deadline: float) -> Flow[Sequence[str]]:
        if target.literal is not None:
            return (str(target.literal),)
        try:
            return (yield from Resolve(target.host, target.port, deadline))
        except TimeoutError:
            raise
        except OSError as error:
            detail = str(error.strerror or error)
            raise _Failure(
                FetchFailed(
                    why=FetchWhy.UNRESOLVED, url=target.url, host=target.host, detail=detail
                )
            ) from None

    def _send(self, approval: Approval, deadline: float) -> Flow[Head]:
        for index, address in enumerate(approval.addresses):
            try:
                return (yield from Send(self._request(approval, address, deadline)))
            except OSError as error:
                if error.errno not in _TRY_NEXT or index == len(approval.addresses) - 1:
                    raise
        raise AssertionError(
            "unreachable: approve() never returns no addresses"
        )  # pragma: no cover
