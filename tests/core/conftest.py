"""Values shared by the core tests (``make_agent`` and ``MakeAgent`` live in tests/conftest.py)."""

from __future__ import annotations

ECHO_TOOL = """
name = "echo"
description = "Echo the arguments back."
command = ["python3", "-c", "import sys; print(sys.stdin.read())"]
"""
