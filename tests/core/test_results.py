"""The result text rules, exactly as the spec words them."""

from __future__ import annotations

import enum

import attrs
import pytest

from astralvessel._ground._outcome import Outcome, decide
from astralvessel._ground._refusals import (
    DESTINATIONS,
    REASON_CHARS,
    RULE,
    Refusals,
    Refused,
    Why,
    record,
    refusal_words,
)
from astralvessel.results import (
    ToolResult,
    refusal_notes,
    render_file,
    render_grep,
    render_host_value,
    render_output,
    render_service_reply,
    render_timeout,
    render_tool_error,
    with_refusal_notes,
)
from astralvessel.sandbox import FileOutcome, RunOutcome
from astralvessel.web._proxyhead import ProxyRefusal, refusal_bytes


def render(output: str, **kw: object) -> str:
    options: dict[str, object] = {
        "exit_code": 0,
        "timed_out": False,
        "dropped_chars": 0,
        "timeout": 30.0,
    }
    options.update(kw)
    return render_output(output, **options)  # type: ignore[arg-type]


def test_output_is_shown_as_is() -> None:
    """Non-empty output is the result text, unchanged."""
    assert render("one\ntwo\n") == "one\ntwo\n"


def test_empty_output_shows_exit_code() -> None:
    """A command that prints nothing shows the model `[exit code N]`."""
    assert render("", exit_code=0) == "[exit code 0]"
    assert render("", exit_code=3) == "[exit code 3]"


def test_timeout_keeps_output_and_appends_note() -> None:
    """A timed-out call keeps its output and ends with `[timed out after N s]`."""
    assert render("partial\n", exit_code=None, timed_out=True, timeout=2.0) == (
        "partial\n[timed out after 2 s]"
    )
    assert render("", exit_code=None, timed_out=True, timeout=0.5) == "[timed out after 0.5 s]"


def test_cut_output_names_dropped_characters() -> None:
    """Output beyond the cap ends with a note naming how many characters were dropped."""
    assert render("abc", dropped_chars=1234) == (
        "abc\n[output truncated: 1234 more characters were dropped]"
    )


def test_bash_always_shows_exit_code() -> None:
    """The bash built-in's output is always followed by `[exit code N]`."""
    assert render("hi\n", exit_code=1, show_exit_code=True) == "hi\n[exit code 1]"


class Colour(enum.Enum):
    RED = "red"


@attrs.frozen
class Point:
    x: int
    colour: Colour


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain text", "plain text"),
        (b"caf\xc3\xa9 \xff", "café \ufffd"),
        (None, "[no output]"),
        ("", "[no output]"),
        ({"n": [1, 2]}, '{"n": [1, 2]}'),
        (Point(1, Colour.RED), '{"x": 1, "colour": "red"}'),
    ],
)
def test_host_values_as_the_model_sees_them(value: object, text: str) -> None:
    """A host tool's value: text as is, bytes decoded, nothing as [no output], the rest JSON."""
    result = render_host_value(value, tool="t", cap=1000)
    assert (result.text, result.is_error) == (text, False)


def test_host_value_that_cannot_be_shown_is_the_hosts_error() -> None:
    """A value with no JSON form raises TypeError naming the tool."""
    with pytest.raises(TypeError, match="tool 't' returned a object"):
        render_host_value(object(), tool="t", cap=1000)


@pytest.mark.parametrize(
    ("result", "text", "dropped"),
    [
        (
            render_host_value("x" * 12, tool="t", cap=5),
            "xxxxx\n[output truncated: 7 more characters were dropped]",
            7,
        ),
        (render_tool_error("no such species", cap=100), "no such species", 0),
        (
            render_file(FileOutcome(text="abcdef", is_error=True), cap=4),
            "abcd\n[output truncated: 2 more characters were dropped]",
            2,
        ),
        (render_timeout("so far\n", timeout=1.5), "so far\n[timed out after 1.5 s]", 0),
        (
            render_timeout("", timeout=2, dropped_chars=3),
            "[output truncated: 3 more characters were dropped]\n[timed out after 2 s]",
            3,
        ),
        (render_grep(RunOutcome(output="", exit_code=1), timeout=5), "No matches found.", 0),
        (
            render_grep(RunOutcome(output="./a:1:x\n", exit_code=0, dropped_chars=9), timeout=5),
            "a:1:x\n[output truncated: 9 more characters were dropped]",
            9,
        ),
    ],
)
def test_every_renderer_joins_notes_one_way(result: ToolResult, text: str, dropped: int) -> None:
    """Each renderer cuts at the cap and ends with the same notes, joined by one line break."""
    assert (result.text, result.dropped_chars) == (text, dropped)


@pytest.mark.parametrize(
    ("head", "body", "dropped", "expected", "is_error"),
    [
        ((200, "OK"), "found otter", 0, "found otter", False),
        ((204, "No Content"), "", 0, "[empty response]", False),
        ((200, "OK"), "abc", 5, "abc\n[output truncated: 5 more characters were dropped]", False),
        (
            (503, "Service Unavailable"),
            "db\n  down",
            0,
            "Error: the catalog service answered HTTP 503 Service Unavailable: db down",
            True,
        ),
        (
            (302, "Found"),
            "",
            0,
            "Error: the catalog service answered HTTP 302 Found (redirects are not followed)",
            True,
        ),
        ((500, ""), "x", 9, "Error: the catalog service answered HTTP 500: x ...", True),
    ],
)
def test_service_replies(
    head: tuple[int, str], body: str, dropped: int, expected: str, is_error: bool
) -> None:
    """A 2xx body is the result; any other status is an error quoting the body's start."""
    status, reason = head
    result = render_service_reply(
        "catalog", status=status, reason=reason, text=body, dropped_chars=dropped, cap=100
    )
    assert (result.text, result.is_error) == (expected, is_error)
    assert result.metadata == {"http_status": str(status)}


def _refused(*destinations: tuple[str, int, Refused]) -> Refusals:
    """A record of one refused connection per ``(host, port, reason)``, in order."""
    refusals = Refusals()
    for host, port, refused in destinations:
        refusals = record(refusals, host, port, refused)
    return refusals


_LISTED = Refused(why=Why.NOT_LISTED, host="a.test", port=443, listed="b.test:443")


@pytest.mark.parametrize(
    ("refusals", "text"),
    [
        (Refusals(), "out\n"),
        (
            _refused(("a.test", 443, _LISTED)),
            "out\n[network: the egress proxy refused a.test:443: "
            f"a.test:443 is not on this turn's network allow-list (b.test:443); {RULE}]",
        ),
        (
            _refused(
                ("a.test", 80, Refused(why=Why.CONNECT_PORT_80, host="a.test")),
                ("a.test", 80, Refused(why=Why.NO_TLS, host="a.test", port=80)),
                ("", 0, Refused(why=Why.REQUEST_LINE)),
            ),
            "out\n[network: the egress proxy refused a.test:80 (2 connections): CONNECT to port "
            "80 is refused: send plain http as an absolute http://a.test/ URL (HTTP_PROXY does "
            "so), whose Host the proxy sets]\n"
            "[network: the egress proxy refused a request it could not read: "
            "the request line is not 'METHOD TARGET HTTP/1.1']",
        ),
    ],
)
def test_refusal_notes_follow_the_output(refusals: Refusals, text: str) -> None:
    """Each refused destination is one note after the command's output, with its count."""
    result = with_refusal_notes(ToolResult(text="out\n"), refusals)
    assert result.text == text


def test_a_flood_of_refusals_is_recorded_and_noted_within_bounds() -> None:
    """Ten thousand refusals to distinct names keep ten destinations, cut reasons and a count."""
    listed = ", ".join(f"n{i}.test:443" for i in range(20)) + ", ..."
    refusals = _refused(
        *(
            (f"h{i}.test", 443, Refused(why=Why.NOT_LISTED, host="x" * 1000, listed=listed))
            for i in range(10_000)
        )
    )
    assert len(refusals.destinations) == DESTINATIONS
    assert refusals.others == 10_000 - DESTINATIONS
    assert refusals.total == 10_000
    assert all(len(d.reason) == REASON_CHARS for d in refusals.destinations)
    # Each fact is kept cut short, and the words cut the same as from the whole facts.
    assert all(len(d.refused.host) == REASON_CHARS for d in refusals.destinations)
    whole = refusal_words(Refused(why=Why.NOT_LISTED, host="x" * 1000, listed=listed))
    assert refusals.destinations[0].reason == whole[: REASON_CHARS - 3] + "..."
    notes = refusal_notes(refusals)
    assert len(notes) == DESTINATIONS + 1
    assert notes[-1] == (
        "[network: the egress proxy refused 9990 more connections to other destinations]"
    )


@pytest.mark.parametrize(
    ("facts", "outcome"),
    [
        ({}, Outcome.OK),
        ({"failed": True}, Outcome.FAILED),
        ({"limit": True, "failed": True}, Outcome.LIMIT),
        ({"timed_out": True, "limit": True, "failed": True}, Outcome.TIMED_OUT),
        ({"host_error": True, "failed": True}, Outcome.HOST_ERROR),
        ({"refused": True, "failed": True}, Outcome.REFUSED),
        ({"lost": True, "refused": True, "timed_out": True}, Outcome.SANDBOX_LOST),
    ],
)
def test_outcome_is_the_first_fact_that_holds(facts: dict[str, bool], outcome: Outcome) -> None:
    """``decide`` names the fact that explains the others: lost, refused, host, timeout, limit."""
    assert decide(**facts) is outcome


def test_a_result_built_by_hand_gets_its_outcome_from_its_flags() -> None:
    """A host's own ToolResult is ``ok``, ``failed`` or ``timed_out`` from its flags."""
    assert ToolResult(text="x").outcome is Outcome.OK
    assert ToolResult(text="x", is_error=True).outcome is Outcome.FAILED
    assert ToolResult(text="x", is_error=True, timed_out=True).outcome is Outcome.TIMED_OUT
    assert ToolResult.error("no").outcome is Outcome.REFUSED


@pytest.mark.parametrize("why", list(Why))
def test_every_refusal_code_is_worded_once_for_the_reply_and_the_note(why: Why) -> None:
    """The proxy's reply to the sandboxed client and the call's note quote the same words."""
    refused = Refused(why=why, host="a.test", port=8443, given="8x", address="10.0.0.1", kind="k")
    refusal = ProxyRefusal(403, refused, host="a.test", port=8443)
    note = refusal_notes(record(Refusals(), "a.test", 8443, refused))
    words = refusal_words(refused)
    assert words
    assert refusal.reason == words
    assert note == [f"[network: the egress proxy refused a.test:8443: {words}]"]
    assert refusal_bytes(403, refusal.reason).endswith(f"proxy: {words}\n".encode())
