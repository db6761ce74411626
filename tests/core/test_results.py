"""The result text rules, exactly as the spec words them."""

from __future__ import annotations

from astralvessel.results import render_output


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
