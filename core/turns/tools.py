"""The multi-turn tool loop's tools: their specs (`--generate-tool-specs-path`) and the function that
runs a call (`--generate-execute-tool-function-path`, Miles' `async def execute_tool(name, params) -> str`);
and the user's episode functions (`--custom-generate-function-path`, `--custom-agent-function-path`).

Loaded once before the first rollout, so a spec that is not an OpenAI tool list, a parameters schema that
is not a JSON schema, or an executor that does not import or is not `async def` stops the run at start
naming the flag (exit 2). A call that raises, returns no string or runs past `--agent-timeout` fails the
run naming the tool, the call, the sample and the user's file:line (as rewards do, core/reward_calls.py).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from grpolab.core.config.agent import AgentConfig
from grpolab.core.dotted_path import import_attribute, import_callable
from grpolab.core.reward_calls import error_location, function_name, is_async, within
from grpolab.core.turns.tool_calls import ToolCall, tool_names_of

SPECS_FLAG = "--generate-tool-specs-path"
EXECUTE_FLAG = "--generate-execute-tool-function-path"
GENERATE_FLAG = "--custom-generate-function-path"
AGENT_FLAG = "--custom-agent-function-path"
CONTRACTS = {
    GENERATE_FLAG: "async def generate(args, sample, sampling_params) -> Sample",
    AGENT_FLAG: "async def run(base_url, prompt, request_kwargs, metadata, **kw) -> reward",
}


class ToolError(RuntimeError):
    """A tool call failed: raised, returned no string, or ran past `--agent-timeout` (the message names
    the tool, the call, the sample and where it raised)."""


async def call_within(
    fn: Callable[..., Awaitable[Any]], args: tuple, *, timeout: float, flag: str, where: str,
    error: type[RuntimeError] = RuntimeError,
) -> Any:  # fmt: skip
    """`await fn(*args)` for at most `timeout` seconds (`--agent-timeout`): a tool call, a custom generate
    call or an agent episode. A TimeoutError the user's code raises is its own error, never taken for
    the timeout (`reward_calls.within`).

    Raises:
        `error`: the call raised (naming `flag`, the function, `where`, the exception and the user's
            file:line), or ran past `timeout`.
    """
    name = function_name(fn)
    try:
        finished, result = await within(fn(*args), timeout, name=f"{name} on {where}")
    except Exception as e:
        raise error(f"{flag} {name} raised {type(e).__name__}: {e} on {where}{error_location(fn, e)}") from e
    if not finished:
        raise error(f"{flag} {name} ran past --agent-timeout {timeout:g} s on {where}")
    return result


POSITIONAL = {GENERATE_FLAG: 3, AGENT_FLAG: 4}
"""How many positional arguments each contract passes (CONTRACTS)."""


def _async_function(path: str, flag: str, contract: str, positional: int | None = None) -> Callable[..., Any]:
    """The `async def` function `flag` names, checked to take `positional` positional arguments.

    Raises:
        ValueError: it does not import, is not callable, is not `async def` or cannot take the contract's
            arguments (naming the flag, its signature and `contract`).
    """
    fn = import_callable(path, flag)
    if not is_async(fn):
        raise ValueError(f"{flag} {path}: must be `{contract}` (it is awaited)")
    if positional is not None:
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # no signature to read (a C callable): the call will tell
            return fn
        try:
            signature.bind(*range(positional))
        except TypeError as e:
            raise ValueError(
                f"{flag} {path}{signature}: must be `{contract}`; it cannot be called with the contract's "
                f"{positional} positional arguments ({e})"
            ) from None
    return fn


@dataclass(frozen=True)
class ToolSet:
    """The tools of a run.

    Attributes:
        specs: the OpenAI tool specs given to the chat template ([] when none were named).
        names: the tools a reply may call (empty: any name).
        execute: `async (name, params) -> str`.
        timeout: `--agent-timeout`, seconds per call.
    """

    specs: list[dict]
    names: tuple[str, ...]
    execute: Callable[[str, dict], Awaitable[Any]]
    timeout: float

    async def run(self, call: ToolCall, *, where: str) -> str:
        """The tool message content of one call.

        Args:
            call: the parsed call (its arguments a JSON object text).
            where: names the call in errors, e.g. "sample 3, turn 1, call 0".

        Raises:
            ToolError: see the class.
        """
        where = f"{where} (tool {call.name!r}, arguments {call.arguments})"
        args = (call.name, json.loads(call.arguments))
        result = await call_within(self.execute, args, timeout=self.timeout, flag=EXECUTE_FLAG, where=where,
                                   error=ToolError)  # fmt: skip
        if not isinstance(result, str):
            raise ToolError(
                f"{EXECUTE_FLAG} {function_name(self.execute)} returned {type(result).__name__} on {where}: "
                "a tool's result is the tool message's content, a str (Miles' contract)"
            )
        return result


def load_tool_specs(path: str) -> list[dict]:
    """The tool specs `--generate-tool-specs-path` names: a `.json` file or a `pkg.module.NAME` attribute.

    Raises:
        ValueError: naming the flag: the file or attribute is missing, not JSON, not a list of
            `{type: function, function: {name, parameters}}`, or a `parameters` that is not a JSON schema.
    """
    if path.endswith(".json"):
        file = Path(path)
        try:
            specs = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ValueError(f"{SPECS_FLAG} {path}: no such file") from e
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{SPECS_FLAG} {path}: not a JSON file ({e})") from e
    else:
        if "." not in path:
            raise ValueError(f"{SPECS_FLAG} {path!r} must be a .json file or 'package.module.NAME'")
        specs = import_attribute(path, SPECS_FLAG)
        if callable(specs):
            specs = specs()
    try:
        tool_names_of(specs)
    except ValueError as e:
        raise ValueError(f"{SPECS_FLAG} {path}: {e}") from e
    if not specs:
        raise ValueError(f"{SPECS_FLAG} {path}: the tool list is empty")
    for i, spec in enumerate(specs):
        schema = spec["function"].get("parameters", {"type": "object"})
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise ValueError(
                f"{SPECS_FLAG} {path}: tools[{i}] ({spec['function']['name']}) parameters is not a JSON "
                f"schema: {e.message}"
            ) from e
    return specs


def load_tools(config: AgentConfig) -> ToolSet | None:
    """The run's tools (None without `--generate-execute-tool-function-path`).

    Raises:
        ValueError: the specs (`load_tool_specs`) or the executor: not importable, not callable, or not
            `async def` (Miles awaits it).
    """
    if not config.multi_turn:
        return None
    assert config.generate_execute_tool_function_path is not None
    contract = "async def execute_tool(name: str, params: dict) -> str"
    fn = _async_function(config.generate_execute_tool_function_path, EXECUTE_FLAG, contract, 2)
    specs = load_tool_specs(config.generate_tool_specs_path) if config.generate_tool_specs_path else []
    names = tuple(tool_names_of(specs))
    return ToolSet(specs=specs, names=names, execute=fn, timeout=config.agent_timeout)


def load_episode_function(config: AgentConfig) -> tuple[str, Callable[..., Any]] | None:
    """(flag, function) of `--custom-generate-function-path` or `--custom-agent-function-path`, or None.

    Raises:
        ValueError: the function does not import, is not callable or is not `async def` (naming the
            flag and the contract).
    """
    for flag, path in (
        (GENERATE_FLAG, config.custom_generate_function_path),
        (AGENT_FLAG, config.custom_agent_function_path),
    ):
        if path:
            return flag, _async_function(path, flag, CONTRACTS[flag], POSITIONAL[flag])
    return None
