"""Tool executors for the tool-loop tests: each one a way a user's tool can fail (imported by path)."""

from __future__ import annotations

import asyncio


async def raises(name: str, params: dict) -> str:
    """Fails on every call."""
    raise KeyError(f"no answer for {params}")


async def sleeps(name: str, params: dict) -> str:
    """Outlasts any small --agent-timeout."""
    await asyncio.sleep(30)
    return "late"


async def raises_timeout(name: str, params: dict) -> str:
    """The tool's own TimeoutError (its HTTP client gave up): an error of the tool, not --agent-timeout."""
    raise TimeoutError("the calculator service did not answer")


async def returns_number(name: str, params: dict) -> int:
    """Returns a number, not the tool message's text."""
    return 5


def not_async(name: str, params: dict) -> str:
    """Miles awaits the executor: a plain function is refused."""
    return "5"


BAD_SCHEMA = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "no-such-type"}}}]
"""A tool whose parameters are not a JSON schema."""


async def agent_openai(base_url: str, prompt: list[dict], request_kwargs: dict, metadata: dict, **kw) -> list:
    """The calculator agent through the real `openai` client; one reward per model turn."""
    import json

    from openai import AsyncOpenAI

    from grpolab.examples.calculator.tools import TOOL_SPECS, execute_tool

    client = AsyncOpenAI(base_url=base_url, api_key="-")
    messages, rewards = list(prompt), []
    for _ in range(3):
        reply = await client.chat.completions.create(messages=messages, tools=TOOL_SPECS, **request_kwargs)
        message = reply.choices[0].message
        messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
        rewards.append(0.5 if message.tool_calls else float(metadata["label"] in (message.content or "")))
        if reply.choices[0].finish_reason != "tool_calls":
            break
        for call in message.tool_calls:
            result = await execute_tool(call.function.name, json.loads(call.function.arguments))
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": result}
            )
    await client.close()
    return rewards


async def agent_silent(
    base_url: str, prompt: list[dict], request_kwargs: dict, metadata: dict, **kw
) -> float:
    """Never asks the model."""
    return 1.0


async def agent_too_many_rewards(
    base_url: str, prompt: list[dict], request_kwargs: dict, metadata: dict, **kw
) -> list:
    """One reply, three rewards."""
    import json
    import urllib.request

    body = json.dumps({**request_kwargs, "messages": prompt}).encode()
    req = urllib.request.Request(
        f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(req, timeout=60).read()
    return [1.0, 0.0, 1.0]


async def generate_bad_mask(args, sample, sampling_params):
    """Returns a response whose loss mask is one token short."""
    sample.tokens = sample.tokens + [5, 6, 2]
    sample.response_length, sample.response = 3, "x"
    sample.loss_mask, sample.rollout_log_probs = [1, 1], [-0.1, -0.2, -0.3]
    sample.status = sample.Status.COMPLETED
    return sample


async def agent_sleeps(
    base_url: str, prompt: list[dict], request_kwargs: dict, metadata: dict, **kw
) -> float:
    """Outlasts any small --agent-timeout."""
    await asyncio.sleep(30)
    return 1.0


async def agent_blocks(
    base_url: str, prompt: list[dict], request_kwargs: dict, metadata: dict, **kw
) -> float:
    """Blocks its event loop (a synchronous sleep inside `async def`): no asyncio timeout can fire."""
    import time

    time.sleep(3)  # the line the error names
    return 1.0


async def blocks(name: str, params: dict) -> str:
    """A tool that blocks its event loop."""
    import time

    time.sleep(3)  # the line the error names
    return "late"


async def agent_rewrites_history(
    base_url: str, prompt: list[dict], request_kwargs: dict, metadata: dict, **kw
) -> float:
    """Two turns, the second with its first message rewritten: the session answers 409, which this
    client (urllib) shows only as "HTTP Error 409: Conflict"."""
    import json
    import urllib.request

    def send(messages: list[dict]) -> dict:
        body = json.dumps({**request_kwargs, "messages": messages}).encode()
        req = urllib.request.Request(
            f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        return json.loads(urllib.request.urlopen(req, timeout=60).read())

    reply = send(prompt)["choices"][0]["message"]
    changed = [{**prompt[0], "content": prompt[0]["content"] + " (edited)"}, *prompt[1:]]
    send([*changed, {"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "and?"}])
    return 1.0


async def agent_wrong_signature(base_url: str) -> float:
    """Takes one argument where the contract passes four."""
    return 1.0
