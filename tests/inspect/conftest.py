"""Fixtures for the inspect_ai provider's tests: inspect_ai installs on Python 3.11 and later."""

from __future__ import annotations

import sys

import pytest

# inspect_ai does not install on 3.10 (the `inspect` extra says so): there is nothing to test.
collect_ignore_glob = ["test_*.py"] if sys.version_info < (3, 11) else []

#: The backends the provider runs on in CI; ids carry the name, so CI's backend filter applies.
BACKENDS = ["bubblewrap", "nsjail", "docker"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark inspect's self-check ``slow``: its checks (inspect's own, of any provider) go through
    the provider code this package's other inspect tests run on every Python; on the
    full-matrix Python it runs whole, as root and as the calls' ordinary user."""
    for item in items:
        if item.path.name == "test_self_check.py":
            item.add_marker(pytest.mark.slow)
