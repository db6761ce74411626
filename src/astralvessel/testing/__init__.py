"""A testing kit for hosts of astralvessel: a fake sandbox, scripted model turns, a pytest plugin.

``FakeSandbox`` stands in for a real backend below the executor, so a test of
the host's loop sees exactly the results production would, in microseconds.
The pytest plugin (``astralvessel.testing.pytest_plugin``, registered through
the ``pytest11`` entry point) adds the ``vessel_*`` fixtures and agent-folder
checks. See "Testing your agent" in the docs.
"""

from __future__ import annotations

from ..errors import UnscriptedCallError as UnscriptedCallError
from ._fake import Answer as Answer
from ._fake import FakeCall as FakeCall
from ._fake import FakeRun as FakeRun
from ._fake import FakeSandbox as FakeSandbox
from ._fakeexec import ExecAnswer as ExecAnswer
from ._fakeexec import FakeExec as FakeExec
from ._model import ModelTurn as ModelTurn
from ._model import ScriptedCall as ScriptedCall
from ._model import ScriptedModel as ScriptedModel
from ._model import ToolAnswer as ToolAnswer
from ._model import tool_call as tool_call

__all__ = [
    "Answer",
    "ExecAnswer",
    "FakeCall",
    "FakeExec",
    "FakeRun",
    "FakeSandbox",
    "ModelTurn",
    "ScriptedCall",
    "ScriptedModel",
    "ToolAnswer",
    "UnscriptedCallError",
    "tool_call",
]
