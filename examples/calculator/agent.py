"""The calculator agent as an agent workflow (`--custom-agent-function-path`, `grpolab agent run`).

    async def run(base_url, prompt, request_kwargs, metadata, **kw) -> reward

It speaks OpenAI chat to `base_url` (a token-in/token-out session: the run keeps every turn's exact
ids), offers the calculator tool, runs each tool call the model makes, sends the whole history back,
and scores the final answer with the `math` reward against `metadata["label"]`. Plain `urllib`, so it
needs no client library; `openai.AsyncOpenAI(base_url=base_url, api_key="-")` works the same way.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from grpolab.core.rewards import math_reward
from grpolab.examples.calculator.tools import TOOL_SPECS, execute_tool

MAX_TURNS = 4
_POOL = ThreadPoolExecutor(max_workers=64)  # every episode's request in flight at once: they batch


def _post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as answer:
        return json.loads(answer.read())


async def run(base_url: str, prompt: list[dict], request_kwargs: dict, metadata: dict, **kw) -> float:
    """One episode: at most `MAX_TURNS` model turns; the reward of the last answer."""
    messages = list(prompt)
    loop = asyncio.get_running_loop()
    answer = ""
    for _ in range(MAX_TURNS):
        body = {**request_kwargs, "messages": messages, "tools": TOOL_SPECS}
        body.update(body.pop("extra_body", {}))
        reply = await loop.run_in_executor(_POOL, _post, f"{base_url}/chat/completions", body)
        choice = reply["choices"][0]
        message = choice["message"]
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        answer = message.get("content") or ""
        if choice["finish_reason"] != "tool_calls":
            break
        for call in message["tool_calls"]:
            fn = call["function"]
            result = await execute_tool(fn["name"], json.loads(fn["arguments"]))
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "name": fn["name"], "content": result}
            )
    return math_reward(answer, metadata["label"])
