"""Tool calls in a model's text: the Qwen/Hermes `<tool_call>{json}</tool_call>` format (pure).

The format is the one Qwen2.5/Qwen3 chat templates teach (and SGLang's `qwen25` / `hermes` tool-call
parsers read, `srt/function_call/qwen25_detector.py`): each call is a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`. A block that does not
parse (bad JSON, no string `name`, `arguments` not an object, a tool the request did not offer) is
not a call: it stays in the content as the model wrote it and is counted in `parse_errors`, so an
agent (and `rollout/tool_parse_errors`) sees the model's real output, never a null content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its arguments as a JSON object text (OpenAI's shape)."""

    name: str
    arguments: str


@dataclass
class ParsedToolCalls:
    """A model answer split into its text and its tool calls.

    Attributes:
        content: the text outside the parsed calls (stripped; a block that did not parse stays in it).
        calls: the parsed calls, in order.
        parse_errors: one message per `<tool_call>` block that did not parse (what was wrong).
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)


def _parse_block(raw: str, tool_names: Collection[str]) -> ToolCall | str:
    """One block's inside -> its call, or the reason it is not one."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return f"not JSON ({e.msg} at character {e.pos})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return 'not an object with a string "name"'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON text already
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"the arguments of {obj['name']!r} are a string that is not JSON"
    if not isinstance(args, dict):
        return f"the arguments of {obj['name']!r} are not an object"
    if tool_names and obj["name"] not in tool_names:
        return (
            f"calls {obj['name']!r}, which the request's tools do not offer ({', '.join(sorted(tool_names))})"
        )
    return ToolCall(name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


def parse_tool_calls(text: str, tool_names: Collection[str] = ()) -> ParsedToolCalls:
    """Split `text` into content and `<tool_call>` calls.

    Args:
        text: the model's decoded answer.
        tool_names: the names of the tools the request offered (empty: any name is accepted).

    Returns:
        `ParsedToolCalls`; with no `<tool_call>` in `text`, the content is `text` unchanged.
    """
    if TOOL_CALL_OPEN not in text:
        return ParsedToolCalls(content=text)
    kept: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        kept.append(text[pos : m.start()])
        parsed = _parse_block(m.group(1).strip(), tool_names)
        if isinstance(parsed, ToolCall):
            calls.append(parsed)
        else:
            errors.append(f"tool call {len(calls) + len(errors) + 1}: {parsed}")
            kept.append(m.group(0))
        pos = m.end()
    rest = text[pos:]
    if TOOL_CALL_OPEN in rest:  # an unclosed block (the answer was cut): the model's text, not a call
        errors.append(f"tool call {len(calls) + len(errors) + 1}: no closing {TOOL_CALL_CLOSE}")
    kept.append(rest)
    return ParsedToolCalls(content="".join(kept).strip() if calls else text, calls=calls, parse_errors=errors)


def tool_names_of(tools: object) -> list[str]:
    """The function names of an OpenAI `tools` list (`[{"type": "function", "function": {"name", ...}}]`).

    Raises:
        ValueError: `tools` is not a list of such objects (the message names the first bad entry).
    """
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ValueError(
            f"tools must be a list of {{type: function, function: {{name, ...}}}}, got {tools!r}"
        )
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
        ):
            raise ValueError(f"tools[{i}] must be {{type: function, function: {{name, ...}}}}, got {tool!r}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}].function needs a non-empty string name")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        names.append(fn["name"])
    return names
