"""The exceptions astralvessel raises to the host.

Only the host's mistakes raise; the model's mistakes come back as a
``ToolResult`` with ``is_error=True``. Each error is also the builtin a
caller would naturally catch::

    AstralVesselError(Exception)
    ├── ConfigError(ValueError)                 agent folder or tool file invalid
    ├── BackendUnavailableError(RuntimeError)   a sandbox cannot start here
    │   └── PromiseNotEnforcedError             ... because a promise would be broken
    ├── SandboxError(RuntimeError)              a running sandbox failed (server died, engine gone)
    ├── TurnClosedError(RuntimeError)           a call on a turn that has ended
    ├── ToolRegistrationError(ValueError)       a tool cannot join a registry
    ├── ToolError(RuntimeError)                 raised by a host tool: a failure shown to the model
    ├── UsageError(ValueError)                  a value the API does not accept (a bad mount,
    │                                            an unknown dialect or scope)
    ├── EgressError(ValueError)                 web: a URL or address the policy refuses
    ├── SearchError(RuntimeError)               web: a search provider could not answer
    ├── TransportError(OSError)                 web: one HTTP exchange failed
    ├── UnscriptedCallError(LookupError)        testing: a fake met what its script
    │                                            does not answer (the test's mistake)
    ├── SnapshotError(ValueError)               a snapshot's files or saved form are refused
    │                                            (a special file, a truncated, tampered or
    │                                            hostile archive, past a bound)
    └── SandboxFileError(OSError)               Turn.read_file/write_file/list_dir refused
        ├── SandboxFileNotFoundError(FileNotFoundError)
        ├── SandboxIsADirectoryError(IsADirectoryError)
        ├── SandboxNotADirectoryError(NotADirectoryError)
        ├── SandboxPermissionError(PermissionError)   outside the agent's data or the
        │                                              writable places, read-only, or denied
        └── FileTooLargeError                   past the file bound (errno EFBIG)

The ``SandboxFile*`` errors carry ``errno``, ``strerror`` and ``filename`` (the
sandbox path) like the builtins they also are, so a harness that catches
``FileNotFoundError`` or ``PermissionError`` works unchanged.

Every error a public module raises to the host is defined here, whichever
module also exports it (``astralvessel``, ``astralvessel.web``,
``astralvessel.testing``), so ``except astralvessel.errors.X`` catches it.

``SearchError`` and ``TransportError`` reach the model as error results (the
``Searcher`` and the ``Fetcher`` show their messages); a host meets them only
when it calls a provider or a transport itself. ``astralvessel.web`` exports
both too.

``EgressError.refused`` carries why, as facts: a ``UrlRefused`` (its ``UrlWhy``
code and what the words name), defined here so that this module, the ground's
lowest, imports nothing of the package; ``_ground/_urlrefusals.py`` words it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

__all__ = [
    "AstralVesselError",
    "BackendUnavailableError",
    "ConfigError",
    "ContentRefusal",
    "ContentWhy",
    "EgressError",
    "FetchFailed",
    "FetchWhy",
    "FileTooLargeError",
    "PromiseNotEnforcedError",
    "SandboxError",
    "SandboxFileError",
    "SandboxFileNotFoundError",
    "SandboxIsADirectoryError",
    "SandboxNotADirectoryError",
    "SandboxPermissionError",
    "SearchError",
    "SearchFailed",
    "SearchWhy",
    "SnapshotError",
    "ToolError",
    "ToolRegistrationError",
    "TransportError",
    "TurnClosedError",
    "UnscriptedCallError",
    "UrlRefused",
    "UrlWhy",
    "UsageError",
]


class AstralVesselError(Exception):
    """Base of every error this library raises."""


class ConfigError(AstralVesselError, ValueError):
    """An agent folder or tool file is invalid; ``.problems`` lists each one."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        count = len(self.problems)
        head = "1 problem" if count == 1 else f"{count} problems"
        super().__init__(
            f"{head} in the agent folder:\n" + "\n".join(f"  {p}" for p in self.problems)
        )


class BackendUnavailableError(AstralVesselError, RuntimeError):
    """The chosen sandbox cannot start here; the message says why and what to install."""


class PromiseNotEnforcedError(BackendUnavailableError):
    """A backend would break a confinement promise here, so it refuses to start (fail closed)."""

    def __init__(self, backend: str, promise: str, reason: str) -> None:
        self.backend = backend
        self.promise = promise
        self.reason = reason
        super().__init__(
            f"{backend} cannot enforce the promise {promise!r} on this host: {reason}. "
            f"Fix the host, choose another backend, or relax the promise explicitly "
            f"with Policy.relax({promise!r})."
        )


class SandboxError(AstralVesselError, RuntimeError):
    """A running sandbox failed: its server died, its engine went away, or it broke protocol."""


class TurnClosedError(AstralVesselError, RuntimeError):
    """A call on a turn that has ended; open a new one with ``executor.turn()``."""


class ToolError(AstralVesselError, RuntimeError):
    """Raise this in a Python tool or a bound service callable to report a failure to the model.

    Its message becomes the result text, with ``is_error=True``. Any other
    exception is the host's problem and propagates out of ``Turn.call``.
    """


class UsageError(AstralVesselError, ValueError):
    """The host passed a value the API does not accept; the message says which and why."""


class ToolRegistrationError(AstralVesselError, ValueError):
    """A tool cannot join a registry: its name is taken, shadows a built-in, or is malformed."""


class UrlWhy(enum.Enum):
    """Why webfetch's egress rule refused: one code per check."""

    # The URL's form.
    TOO_LONG = "too_long"
    URL_CHARS = "url_chars"
    UNPARSED = "unparsed"
    SCHEME = "scheme"
    NO_SCHEME = "no_scheme"
    USER_INFO = "user_info"
    AFTER_V6 = "after_v6"
    PORT_TEXT = "port_text"
    PORT = "port"
    # The URL's host.
    NO_HOST = "no_host"
    V6_UNCLOSED = "v6_unclosed"
    ZONE = "zone"
    BAD_V6 = "bad_v6"
    PERCENT = "percent"
    BAD_NAME = "bad_name"
    ODD_IP = "odd_ip"
    LOCAL_NAME = "local_name"
    # What the host is, or resolved to.
    NOT_AN_ADDRESS = "not_an_address"
    LITERAL_ADDRESS = "literal_address"
    RESOLVED_ADDRESS = "resolved_address"
    NO_ADDRESSES = "no_addresses"


@attrs.frozen(kw_only=True)
class UrlRefused:
    """One refusal: its code, the facts its words name, and the redirect it came by, if any."""

    why: UrlWhy
    #: What the URL or the resolver gave that the words quote: a scheme, a port, a host, an
    #: answer, the parser's error.
    given: str = ""
    #: The URL's host, as checked.
    host: str = ""
    port: int = 0
    #: The address refused, and what kind of address it is.
    address: str = ""
    kind: str = ""
    #: The page that redirected here, and the URL it redirected to ("" for the first hop).
    origin: str = ""
    url: str = ""


class EgressError(AstralVesselError, ValueError):
    """The egress policy refuses a URL or an address; the message is safe to show a model.

    ``refused`` says why by code, with the facts the message names, when webfetch's
    egress rule raised it (None for an error raised with a message alone).
    """

    def __init__(self, *args: object, refused: UrlRefused | None = None) -> None:
        super().__init__(*args)
        self.refused = refused


class ContentWhy(enum.Enum):
    """Why the web tools could not turn a response's body into text: one code per check."""

    #: More than one Content-Encoding (``given``: the header).
    COMPRESSED_TWICE = "compressed_twice"
    #: A Content-Encoding we do not undo (``given``: the coding).
    ENCODING = "encoding"
    #: The compressed body does not decompress (``given``: the encoding, ``detail``: zlib's).
    CORRUPT = "corrupt"
    #: A media type that is not text (``given``: the type).
    NOT_TEXT = "not_text"
    #: A text type whose bytes are binary (``given``: the type).
    BINARY = "binary"


@attrs.frozen(kw_only=True)
class ContentRefusal:
    """Why a body was not read as text: its code and the facts its words name."""

    why: ContentWhy
    given: str = ""
    detail: str = ""


class FetchWhy(enum.Enum):
    """Why webfetch failed after its URL was allowed: one code per way of failing."""

    #: The whole fetch did not finish within ``seconds``.
    TIMEOUT = "timeout"
    #: The exchange failed (``detail``: the OS's or the transport's words).
    UNREACHABLE = "unreachable"
    #: The host name did not resolve (``host``, ``detail``: the resolver's words).
    UNRESOLVED = "unresolved"
    #: A redirect past the limit of ``count`` (``url``: where the last one pointed).
    REDIRECTS = "redirects"
    #: The body could not be read as text (``content`` says why).
    UNREADABLE = "unreadable"


@attrs.frozen(kw_only=True)
class FetchFailed:
    """One failed fetch: its code and the facts its words name."""

    why: FetchWhy
    #: The URL the words name: the one that failed, or for ``REDIRECTS`` the one not followed.
    url: str = ""
    host: str = ""
    detail: str = ""
    seconds: float = 0.0
    count: int = 0
    content: ContentRefusal | None = None


class SearchWhy(enum.Enum):
    """Why websearch ran no search, or the search failed: one code per way."""

    # The call's arguments (nothing was asked).
    NO_QUERY = "no_query"
    RESULT_COUNT = "result_count"
    # No searcher in this deployment.
    NOT_CONFIGURED = "not_configured"
    # The provider, as the Searcher met it.
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    UNREADABLE = "unreadable"
    #: A provider's SearchError raised with a message alone (``detail``).
    SERVICE = "service"
    # The HTTP providers (SearXNG, Brave) and the local index.
    UNRESOLVED = "unresolved"
    NO_ADDRESSES = "no_addresses"
    HTTP_STATUS = "http_status"
    NOT_JSON = "not_json"
    SEARXNG_ANSWER = "searxng_answer"
    BRAVE_ANSWER = "brave_answer"
    NO_WORDS = "no_words"
    LOCAL_INDEX = "local_index"


@attrs.frozen(kw_only=True)
class SearchFailed:
    """One search that did not run or failed: its code and the facts its words name."""

    why: SearchWhy
    #: What the call or the service gave that the words quote: ``max_results``'s repr, a
    #: media type ("" for none).
    given: str = ""
    host: str = ""
    status: int = 0
    #: The OS's, resolver's, index's or provider's own words.
    detail: str = ""
    content: ContentRefusal | None = None


class SearchError(AstralVesselError, RuntimeError):
    """A search provider could not answer; the `Searcher` shows the model the message.

    ``failed`` says why by code, with the facts the message names, when one of
    astralvessel's providers raised it (None for an error raised with a message alone).
    """

    def __init__(self, *args: object, failed: SearchFailed | None = None) -> None:
        super().__init__(*args)
        self.failed = failed


class TransportError(AstralVesselError, OSError):
    """One HTTP exchange failed: the connection, TLS, or a malformed or oversized response.

    Transports raise this (or any other `OSError`, `TimeoutError` included);
    the `Fetcher` turns it into an error result the model sees. It is one of
    the library's errors and also the `OSError` a transport's caller expects.
    """


class SandboxFileError(AstralVesselError, OSError):
    """A file primitive (``Turn.read_file``, ``write_file``, ``list_dir``) was refused.

    ``errno`` says why, ``filename`` is the sandbox path; the subclasses are the
    builtins a caller would catch for the common cases.
    """


class SandboxFileNotFoundError(SandboxFileError, FileNotFoundError):
    """The sandbox path (or a folder on the way to it) does not exist."""


class SandboxIsADirectoryError(SandboxFileError, IsADirectoryError):
    """The sandbox path is a folder where a file was expected."""


class SandboxNotADirectoryError(SandboxFileError, NotADirectoryError):
    """A folder was expected at the sandbox path (or on the way to it), and a file is there."""


class SandboxPermissionError(SandboxFileError, PermissionError):
    """Outside the agent's data or the writable places, on a read-only mount, or denied to
    the calls' user."""


class FileTooLargeError(SandboxFileError):
    """The file is larger than the file primitives' bound (``errno.EFBIG``)."""


class UnscriptedCallError(AstralVesselError, LookupError):
    """A call reached a test double its script does not answer: the test's mistake.

    Raised by ``astralvessel.testing``'s ``FakeSandbox`` and ``ScriptedModel``
    (which also export it), so a test never passes on a call it did not expect.
    """


class SnapshotError(AstralVesselError, ValueError):
    """A snapshot's files or its saved form are refused; the message names the entry and why.

    Raised for a tree that cannot be kept (a device, a fifo, a socket, past a
    bound) and for a saved snapshot that is truncated, tampered with or hostile
    (a name with ``..``, a link out, a size it does not have); nothing of a
    refused archive is left written.
    """
