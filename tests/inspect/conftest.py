"""Fixtures for the inspect_ai provider's tests: inspect_ai installs on Python 3.11 and later."""

from __future__ import annotations

import sys

import pytest

# inspect_ai does not install on 3.10 (the `inspect` extra says so): there is nothing to test.
collect_ignore_glob = ["test_*.py"] if sys.version_info < (3, 11) else []

#: The backends the provider runs on in CI; ids carry the name, so CI's backend filter applies.
BACKENDS = ["bubblewrap", "nsjail", "docker"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark inspect's self-check run as root ``slow``: the provider's default identity (the
    calls' ordinary user) runs the same checks through the same code on every Python."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            item.path.name == "test_self_check.py"
            and callspec is not None
            and callspec.params.get("sandbox_env") == "root"
        ):
            item.add_marker(pytest.mark.slow)
