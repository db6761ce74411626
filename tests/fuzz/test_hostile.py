"""Each hostile input the issue names is an error result, and the turn lives on."""

from __future__ import annotations

import json

import astralvessel as av


def alive(turn: av.Turn) -> None:
    result = turn.call("bash", {"command": "echo still here"})
    assert not result.is_error, result.text
    assert result.text.startswith("still here")


def test_two_megabyte_bash_command_is_an_error_result(turn: av.Turn) -> None:
    """A 2 MB bash command is refused with the bound, and the turn's sandbox survives."""
    alive(turn)
    result = turn.call("bash", {"command": "echo " + "x" * (2 << 20)})
    assert result.is_error
    assert "at most" in result.text
    alive(turn)


def test_command_over_the_argv_bound_is_an_error_result(turn: av.Turn) -> None:
    """A 600 KiB bash command (under the argument bound, over a command line's) is refused."""
    result = turn.call("bash", {"command": "echo " + "y" * 600_000})
    assert result.is_error
    assert "a command line takes at most 131072" in result.text
    alive(turn)


def test_two_megabyte_args_value_is_an_error_result(turn: av.Turn) -> None:
    """A 2 MB args-mode value is refused and the turn goes on."""
    result = turn.call("flags", json.dumps({"v": "z" * (2 << 20)}))
    assert result.is_error
    alive(turn)


def test_nul_in_bash_and_args_value_is_an_error_result(turn: av.Turn) -> None:
    """A NUL byte in a bash command or an args-mode value is a refusal, not a SandboxError."""
    for name, arguments in (("bash", {"command": "echo a\0b"}), ("flags", {"v": "a\0b"})):
        result = turn.call(name, arguments)
        assert result.is_error
        assert "NUL character" in result.text
    alive(turn)


def test_odd_json_is_an_error_result(turn: av.Turn) -> None:
    """Deep nesting, a lone surrogate and a 5000-digit integer each come back as errors."""
    for text in ("[" * 50_000, '{"v": "\\ud800"}', '{"v": ' + "7" * 5000 + "}"):
        result = turn.call("emit", text)
        assert result.is_error
        assert result.text.startswith("Error:")
    alive(turn)


def test_oversized_frame_is_refused_before_sending(turn: av.Turn) -> None:
    """A request whose frame header would pass the 1 MiB bound raises before it is sent."""
    import pytest

    from astralvessel import SandboxError
    from astralvessel.sandbox import RunRequest

    request = RunRequest(
        argv=("/bin/true",), cwd="/" + "w" * (2 << 20), timeout=10, output_chars=100
    )
    with pytest.raises(SandboxError, match="too large to send"):
        turn.session.run(request)
    alive(turn)


def test_a_megabyte_of_argv_runs(turn: av.Turn) -> None:
    """16 arguments of 64 KiB (inspect_ai's sandbox self-check) run: argv is not in the header."""
    from astralvessel.sandbox import RunRequest

    chunks = tuple("a" * (64 << 10) for _ in range(16))
    request = RunRequest(
        argv=("/bin/sh", "-c", 'echo "$#"', "sh", *chunks), timeout=30, output_chars=100
    )
    outcome = turn.session.run(request)
    assert outcome.exit_code == 0, outcome.output
    assert outcome.output == "16\n"
    alive(turn)


def test_reading_eight_million_characters_is_cut_not_fatal(turn: av.Turn) -> None:
    """read of 2000 lines of 4000 characters answers (cut), instead of killing the file worker."""
    made = turn.call(
        "bash", {"command": "python3 -c \"print(('\\x01' * 3999 + '\\n') * 2000, end='')\" > big"}
    )
    assert not made.is_error, made.text
    result = turn.call("read", {"path": "/workspace/big", "limit": 2000})
    assert not result.is_error, result.text[-300:]
    assert "worker died" not in result.text
    alive(turn)
