"""``ScriptedModel``: a model that answers a host's loop from a script, in one API's shape.

Like inspect_ai's ``mockllm``: a test lists what the model says, turn by turn
(tool calls, then a final answer), and hands the scripted model to the host's
loop where the API client would go. Each reply is built in the shape of the
chosen API (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages), the
requests the loop sends are recorded, and ``answers`` reads back, from those
requests, what the loop told the model about each scripted call. So a loop or
a framework adapter is tested end to end with no model and no network.

Each API is one row of ``DIALECTS``: how a reply is built and how the loop's
answers are read back.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from .._ground._suggest import unknown_name
from ..errors import UnscriptedCallError, UsageError

__all__ = ["DIALECTS", "ModelTurn", "ScriptedCall", "ScriptedModel", "ToolAnswer", "tool_call"]


@attrs.frozen(kw_only=True)
class ScriptedCall:
    """One tool call the scripted model makes: the tool's name and its arguments.

    ``arguments`` is a dict, or text sent as is (to test how a loop copes with
    arguments that are not JSON); ``id`` is given when the script leaves it out.
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    arguments: Mapping[str, Any] | str = attrs.field(factory=dict)
    id: str | None = None


def tool_call(
    name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None
) -> ScriptedCall:
    """One scripted tool call (``arguments`` default to ``{}``)."""
    return ScriptedCall(name=name, arguments={} if arguments is None else arguments, id=id)


#: One step of a script: final text, one call, several calls at once (optionally after
#: some text), or a function of the request that returns one of these.
ModelTurn: TypeAlias = (
    str
    | ScriptedCall
    | Sequence[ScriptedCall | str]
    | Callable[[Mapping[str, Any]], "str | ScriptedCall | Sequence[ScriptedCall | str]"]
)


@attrs.frozen(kw_only=True)
class ToolAnswer:
    """What the loop sent the model for one scripted call: the call, its text, its error flag.

    ``is_error`` is None where the API has no error flag (Chat Completions,
    Responses: there the text itself says what went wrong).
    """

    call_id: str
    name: str
    text: str
    is_error: bool | None = None


def _json_args(arguments: Mapping[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(dict(arguments))


# -- OpenAI Chat Completions ----------------------------------------------------------------


def _chat_reply(
    text: str | None, calls: Sequence[tuple[str, ScriptedCall]], n: int
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": c.name, "arguments": _json_args(c.arguments)},
            }
            for cid, c in calls
        ]
    return {
        "id": f"chatcmpl-scripted-{n}",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [
            {"index": 0, "finish_reason": "tool_calls" if calls else "stop", "message": message}
        ],
    }


def _chat_answers(request: Mapping[str, Any]) -> list[tuple[str, str, bool | None]]:
    return [
        (str(m.get("tool_call_id")), _text(m.get("content")), None)
        for m in request.get("messages") or ()
        if isinstance(m, Mapping) and m.get("role") == "tool"
    ]


# -- OpenAI Responses -----------------------------------------------------------------------


def _responses_reply(
    text: str | None, calls: Sequence[tuple[str, ScriptedCall]], n: int
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if text:
        output.append(
            {
                "type": "message",
                "id": f"msg_scripted_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    output += [
        {
            "type": "function_call",
            "id": f"fc_{cid}",
            "call_id": cid,
            "name": c.name,
            "arguments": _json_args(c.arguments),
            "status": "completed",
        }
        for cid, c in calls
    ]
    return {
        "id": f"resp_scripted_{n}",
        "object": "response",
        "model": "scripted",
        "status": "completed",
        "output": output,
        "output_text": text or "",
    }


def _responses_answers(request: Mapping[str, Any]) -> list[tuple[str, str, bool | None]]:
    items = request.get("input")
    if not isinstance(items, Sequence) or isinstance(items, str):
        return []
    return [
        (str(i.get("call_id")), _text(i.get("output")), None)
        for i in items
        if isinstance(i, Mapping) and i.get("type") == "function_call_output"
    ]


# -- Anthropic Messages ---------------------------------------------------------------------


def _anthropic_reply(
    text: str | None, calls: Sequence[tuple[str, ScriptedCall]], n: int
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {
            "type": "tool_use",
            "id": cid,
            "name": c.name,
            "input": dict(c.arguments) if isinstance(c.arguments, Mapping) else c.arguments,
        }
        for cid, c in calls
    ]
    return {
        "id": f"msg_scripted_{n}",
        "type": "message",
        "role": "assistant",
        "model": "scripted",
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def _anthropic_answers(request: Mapping[str, Any]) -> list[tuple[str, str, bool | None]]:
    found: list[tuple[str, str, bool | None]] = []
    for message in request.get("messages") or ():
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            continue
        for block in content or ():
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                found.append(
                    (
                        str(block.get("tool_use_id")),
                        _text(block.get("content")),
                        bool(block.get("is_error", False)),
                    )
                )
    return found


def _text(content: object) -> str:
    """Text content as the APIs carry it: a string, or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
    return "" if content is None else str(content)


@attrs.frozen
class _Dialect:
    reply: Callable[[str | None, Sequence[tuple[str, ScriptedCall]], int], dict[str, Any]]
    answers: Callable[[Mapping[str, Any]], list[tuple[str, str, bool | None]]]
    id_prefix: str


#: Each API the scripted model speaks, by the names ``Registry.schemas`` uses.
DIALECTS: Mapping[str, _Dialect] = {
    "openai": _Dialect(_chat_reply, _chat_answers, "call_"),
    "openai-responses": _Dialect(_responses_reply, _responses_answers, "call_"),
    "anthropic": _Dialect(_anthropic_reply, _anthropic_answers, "toolu_"),
}


class _Namespace:
    """``client.responses``-style attribute paths to one ``create``."""

    def __init__(self, create: Callable[..., dict[str, Any]]) -> None:
        self.create = create


class _Chat:
    """``client.chat.completions.create``."""

    def __init__(self, create: Callable[..., dict[str, Any]]) -> None:
        self.completions = _Namespace(create)


class ScriptedModel:
    """A stand-in for a model API client: answers ``create`` from a script and records requests.

    ``dialect`` is ``"openai"`` (Chat Completions), ``"openai-responses"`` or
    ``"anthropic"``; ``script`` lists the model's turns in order (see
    ``ModelTurn``). ``create(**request)`` returns the next reply as a dict;
    the same method is reachable as ``chat.completions.create``,
    ``responses.create`` and ``messages.create``, so a loop written against
    an SDK client can take this object in its place (if it reads dicts).
    A request past the end of the script raises ``UnscriptedCallError``.
    """

    def __init__(self, dialect: str, script: Sequence[ModelTurn]) -> None:
        if dialect not in DIALECTS:
            raise UsageError(unknown_name("dialect", str(dialect), DIALECTS))
        self.dialect = dialect
        self.script: list[ModelTurn] = list(script)
        #: Every request the loop sent, deep-copied as it was at the time.
        self.requests: list[dict[str, Any]] = []
        #: Every call the model made, with the id it was given, in order.
        self.calls: list[tuple[str, ScriptedCall]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.chat = _Chat(self.create)
        self.responses = _Namespace(self.create)
        self.messages = _Namespace(self.create)

    def create(self, **request: Any) -> dict[str, Any]:
        """Record the request and return the script's next turn in this API's shape."""
        with self._lock:
            self.requests.append(copy.deepcopy(request))
            n = len(self.requests)
            if not self.script:
                raise UnscriptedCallError(
                    f"the scripted model was asked a {_ordinal(n)} time but its script has "
                    f"{n - 1} turns; the loop did not stop where the test expected"
                )
            step = self.script.pop(0)
        if callable(step) and not isinstance(step, ScriptedCall):
            step = step(request)
        text, calls = self._split(step)
        with self._lock:
            named = [
                (c.id or f"{DIALECTS[self.dialect].id_prefix}{next(self._ids)}", c) for c in calls
            ]
            self.calls += named
        return DIALECTS[self.dialect].reply(text, named, n)

    async def acreate(self, **request: Any) -> dict[str, Any]:
        """Async twin of ``create`` (nothing waits)."""
        return self.create(**request)

    @staticmethod
    def _split(step: object) -> tuple[str | None, list[ScriptedCall]]:
        if isinstance(step, str):
            return step, []
        if isinstance(step, ScriptedCall):
            return None, [step]
        if isinstance(step, Sequence):
            texts = [s for s in step if isinstance(s, str)]
            calls = [s for s in step if isinstance(s, ScriptedCall)]
            if len(texts) + len(calls) == len(step) and calls:
                return ("".join(texts) or None), calls
        raise UsageError(
            f"a script step is text, tool_call(...), or a list of calls (and text), not {step!r}"
        )

    @property
    def exhausted(self) -> bool:
        """Whether every scripted turn was used."""
        return not self.script

    def answers(self) -> list[ToolAnswer]:
        """What the loop answered for each scripted call, read from its later requests.

        In call order. Raises ``AssertionError`` naming any call the loop never
        answered, or answered twice.
        """
        seen: dict[str, tuple[str, bool | None]] = {}
        twice: set[str] = set()
        for request in self.requests:
            for call_id, text, is_error in DIALECTS[self.dialect].answers(request):
                if call_id in seen and seen[call_id] != (text, is_error):
                    twice.add(call_id)
                seen[call_id] = (text, is_error)
        missing = [f"{c.name} ({cid})" for cid, c in self.calls if cid not in seen]
        if missing or twice:
            raise AssertionError(
                "the loop never sent the model an answer for " + ", ".join(missing)
                if missing
                else f"the loop answered {', '.join(sorted(twice))} more than once, differently"
            )
        return [
            ToolAnswer(call_id=cid, name=c.name, text=seen[cid][0], is_error=seen[cid][1])
            for cid, c in self.calls
        ]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
