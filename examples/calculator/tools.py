"""The calculator tool: its OpenAI spec (`--generate-tool-specs-path`) and the function that runs a call
(`--generate-execute-tool-function-path`, Miles' `async def execute_tool(name, params) -> str`).

    grpolab train --hf-checkpoint fixtures/tiny-qwen3-tools --apply-chat-template \\
        --generate-execute-tool-function-path grpolab.examples.calculator.tools.execute_tool \\
        --generate-tool-specs-path grpolab.examples.calculator.tools.TOOL_SPECS ...

The expression is read with `ast` (numbers, + - * / and parentheses only), never `eval`: a model's
text is untrusted input. A bad expression is the tool's answer ("error: ..."), not an exception: the
model reads it in the next turn, as an agent's environment answers.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

TOOL_SPECS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string", "description": "e.g. 6 - 1"}},
                "required": ["expr"],
            },
        },
    }
]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_DIGITS = 30
"""Longest number the tool answers with (a model can write 9**9**9-sized products by chaining `*`)."""


def _value(node: ast.AST) -> Fraction:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def evaluate(expr: str) -> str:
    """The value of `expr` as text ("5", "2.5"), or "error: ..." for anything but arithmetic."""
    try:
        value = _value(ast.parse(expr.strip(), mode="eval").body)
    except ZeroDivisionError:
        return "error: division by zero"
    except (SyntaxError, ValueError, RecursionError) as e:
        return f"error: {e}" if isinstance(e, ValueError) else "error: not an arithmetic expression"
    text = str(value.numerator) if value.denominator == 1 else f"{float(value):g}"
    return text if len(text) <= MAX_DIGITS else "error: the number is too long"


async def execute_tool(name: str, params: dict) -> str:
    """Run one call: `calc` with `{"expr": "6 - 1"}` -> "5"; any other tool or argument is an error text."""
    if name != "calc":
        return f"error: no tool named {name!r} (tools: calc)"
    expr = params.get("expr")
    if not isinstance(expr, str):
        return 'error: calc takes {"expr": "<arithmetic>"}'
    return evaluate(expr)
