"""The sample host's fixtures: the plugin's, with the host's own registry."""

from __future__ import annotations

import pytest

import astralvessel as av

from .host import build_registry


@pytest.fixture
def vessel_registry(vessel_agent: av.Agent) -> av.Registry:
    """The registry the host builds: the agent's tools and its Python tool."""
    return build_registry(vessel_agent)
