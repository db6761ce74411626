"""The Deep Agents example runs offline, end to end, in a real sandbox (Python 3.11 and later)."""

from __future__ import annotations

from .test_examples import FRAMEWORKS, RunScript, run_script

__all__ = ["run_script"]  # the fixture, shared with test_examples.py


def test_deepagents_sandbox_example(run_script: RunScript) -> None:
    """The Deep Agent writes a script, edits it and runs it, each step in the turn's sandbox."""
    lines = run_script(FRAMEWORKS / "deepagents_sandbox.py").splitlines()
    assert lines[:3] == [
        "write_file: Updated file /workspace/hello.py",
        "edit_file: Successfully replaced 1 instance(s) of the string in '/workspace/hello.py'",
        "execute: hello",
    ]
    assert lines[-1] == "It prints hello."
