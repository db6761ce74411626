"""The sample host's own tool schemas, per model API, against reviewed snapshots."""

from __future__ import annotations

import pytest

import astralvessel as av
from astralvessel.testing.pytest_plugin import SchemaSnapshot

pytestmark = pytest.mark.vessel_agent("agent")


@pytest.mark.parametrize("dialect", ["openai", "openai-responses", "anthropic", "mcp"])
def test_schemas_match_the_snapshot(
    vessel_registry: av.Registry, vessel_schema_snapshot: SchemaSnapshot, dialect: str
) -> None:
    """What the model is shown of the host's own tools changes only with a reviewed snapshot."""
    # The built-ins' schemas are the library's to change; the host snapshots what it owns.
    own = av.Registry(spec for spec in vessel_registry if spec.kind is not av.ToolKind.BUILTIN)
    vessel_schema_snapshot(own, dialect)
