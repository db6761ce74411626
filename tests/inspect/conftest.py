"""Fixtures for the inspect_ai provider's tests: inspect_ai installs on Python 3.11 and later."""

from __future__ import annotations

import sys

# inspect_ai does not install on 3.10 (the `inspect` extra says so): there is nothing to test.
collect_ignore_glob = ["test_*.py"] if sys.version_info < (3, 11) else []

#: The backends the provider runs on in CI; ids carry the name, so CI's backend filter applies.
BACKENDS = ["bubblewrap", "nsjail", "docker"]
