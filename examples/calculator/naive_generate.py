"""A deliberately broken calculator generate function: the tool turn tokenised the naive way.

    grpolab train ... --custom-generate-function-path grpolab.examples.calculator.naive_generate.generate

A Miles-style multi-turn generate function (`async def generate(args, sample, sampling_params)`,
posting to `/generate` at `args.sglang_router_ip:args.sglang_router_port`) that appends each tool
result as the tokens of `render([user, assistant, tool], generation prompt) - render([user,
assistant])` of a stand-in conversation. The stand-in's rendering ends with the assistant's
`<|im_end|>\\n`, so the `\\n` the template puts after the model's `<|im_end|>` is never added: every
later turn is trained on a context the template never produces (verl #6501). It trains without an
error; `grpolab check turns` on its recording names the missing boundary token at every tool turn.
The stock tool loop (`--generate-execute-tool-function-path`) keeps it.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import cache

from grpolab.core.modeling import load_tokenizer
from grpolab.core.turns.tool_calls import parse_tool_calls
from grpolab.examples.calculator.tools import execute_tool

_POOL = ThreadPoolExecutor(
    max_workers=64
)  # every sample's request in flight at once: they batch on the engine
_STAND_IN = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]


@cache
def _tokenizer(path: str):
    return load_tokenizer(path)


def _post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as answer:
        return json.loads(answer.read())


def naive_tool_tokens(tokenizer, tool_messages: list[dict]) -> list[int]:
    """The tool messages' ids as `render(stand-in + tools, generation prompt) - render(stand-in)`."""
    with_tools = tokenizer.apply_chat_template(
        _STAND_IN + tool_messages, tokenize=False, add_generation_prompt=True
    )
    without = tokenizer.apply_chat_template(_STAND_IN, tokenize=False, add_generation_prompt=False)
    return tokenizer.encode(with_tools[len(without) :], add_special_tokens=False)


async def generate(args, sample, sampling_params):
    """One calculator episode (see the module docstring): `sample` filled and returned."""
    tok = _tokenizer(args.hf_checkpoint)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    messages = list(sample.prompt)
    prompt_len = len(sample.tokens)
    sample.loss_mask, sample.rollout_log_probs = [], []
    budget = sampling_params["max_new_tokens"]
    for turn in range(args.generate_max_turns):
        params = {**sampling_params, "max_new_tokens": budget - (len(sample.tokens) - prompt_len)}
        if params["max_new_tokens"] <= 0:
            sample.status = sample.Status.TRUNCATED
            break
        payload = {"input_ids": sample.tokens, "sampling_params": params, "return_logprob": True}
        out = await asyncio.get_running_loop().run_in_executor(_POOL, _post, url, payload)
        pairs = out["meta_info"]["output_token_logprobs"]
        sample.tokens += [t for _, t, _ in pairs]
        sample.rollout_log_probs += [lp for lp, _, _ in pairs]
        sample.loss_mask += [1] * len(pairs)
        messages.append({"role": "assistant", "content": out["text"]})
        if out["meta_info"]["finish_reason"]["type"] == "length":
            sample.status = sample.Status.TRUNCATED
            break
        calls = parse_tool_calls(out["text"], ["calc"]).calls
        sample.status = sample.Status.COMPLETED
        if not calls:
            break
        tools = [
            {"role": "tool", "tool_call_id": f"call_{turn}_{i}", "name": c.name,
             "content": await execute_tool(c.name, json.loads(c.arguments))}
            for i, c in enumerate(calls)
        ]  # fmt: skip
        messages += tools
        ids = naive_tool_tokens(tok, tools)
        sample.tokens += ids
        sample.rollout_log_probs += [0.0] * len(ids)
        sample.loss_mask += [0] * len(ids)
    sample.response_length = len(sample.tokens) - prompt_len
    keep = sample.response_length
    sample.tokens = sample.tokens[: prompt_len + min(keep, budget)]
    sample.response_length = len(sample.tokens) - prompt_len
    sample.loss_mask = sample.loss_mask[: sample.response_length]
    sample.rollout_log_probs = sample.rollout_log_probs[: sample.response_length]
    sample.response = tok.decode(sample.tokens[prompt_len:], skip_special_tokens=True)
    sample.metadata["messages"] = messages  # Miles' trajectory: what grpolab check turns re-renders
    return sample
