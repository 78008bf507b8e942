"""The multi-turn tool loop: each sample's turns generated with exact tokens, tools run between them.

Miles' `generate_hub/multi_turn.py` contract (`--generate-execute-tool-function-path`, `--generate-tool-
specs-path`, `--generate-max-turns`, `--generate-tool-call-parser`), run batched: every turn is one
`engine.generate` call over the samples still going, so it works on the in-process engine and on the
fleet alike, and every turn's seed is the sample's (`core.seeding.derive_turn_seed`), so a sample's
episode does not depend on its batch companions' turns.

Per sample (a `core.turns.record.TokenRecord`): the prompt of turn k is the ids of turn k-1 plus the tool
messages' tokens and the template's boundary tokens (Qwen's `\\n` after `<|im_end|>`), never the
history re-tokenised (core/turns/record.py). A reply with no tool call ends the episode ("answer"); so
do the turn limit, the response budget (`--rollout-max-response-len` counts every response token, tool
tokens too, as Miles' does) and `--rollout-max-context-len` (finish "length"). Model tokens get loss
mask 1 and their engine log-probs; tool, user and boundary tokens mask 0 and log-prob 0.0 (Miles' fill).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import torch

from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.data import Prompt, PromptDataset
from grpolab.core.engine.base import (
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
    generate_within,
)
from grpolab.core.seeding import derive_turn_seed
from grpolab.core.turns.codec import ChatCodec
from grpolab.core.turns.episode import episode_metadata
from grpolab.core.turns.record import TokenRecord, add_reply, append_turn
from grpolab.core.turns.tool_calls import ToolCall, parse_tool_calls
from grpolab.core.turns.tools import EXECUTE_FLAG, ToolSet
from grpolab.core.turns.watched import run_watched
from grpolab.rollout.sample_plan import plan_samples


@dataclass
class Episode:
    """One sample's conversation while it is generated."""

    index: int
    group: int
    k: int
    prompt: Prompt
    seed: int
    record: TokenRecord
    kept: list[torch.Tensor] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    parse_errors: int = 0
    ended: str = ""
    finish: str = "stop"

    @property
    def response_length(self) -> int:
        return len(self.record.ids) - self.record.prompt_length


def _call_id(ep: Episode, turn: int, call: int) -> str:
    """A tool call's id, the same on every run (the template may render it)."""
    return f"call_{ep.seed % 10**12:012d}_{turn}_{call}"


def _take_reply(
    ep: Episode, res: GenerationResult, codec: ChatCodec, tools: ToolSet, turn: int
) -> list[ToolCall]:
    """Record one reply; the tool calls it makes (none: the episode has ended)."""
    text = codec.content(res.response_ids)
    add_reply(
        ep.record, res.response_ids, res.log_probs.float().tolist(), str(res.weight_version),
        {"role": "assistant", "content": text}, res.finish_reason,
    )  # fmt: skip
    if res.kept_token_ids is not None:
        ep.kept += list(res.kept_token_ids)
    if res.finish_reason == "length":
        ep.ended, ep.finish = "length", "length"
        return []
    parsed = parse_tool_calls(text, tools.names)
    ep.parse_errors += len(parsed.parse_errors)
    if not parsed.calls:
        ep.ended = "answer"
    return parsed.calls


async def _run_calls(work: list[tuple[Episode, int, list[ToolCall]]], tools: ToolSet) -> list[list[str]]:
    """Every call of this turn, all at once: per episode, its calls' results in order."""

    async def one(ep: Episode, turn: int, calls: list[ToolCall]) -> list[str]:
        where = f"sample {ep.index} (group {ep.group}, prompt row {ep.prompt.index}), turn {turn + 1}"
        return list(
            await asyncio.gather(*(tools.run(c, where=f"{where}, call {i}") for i, c in enumerate(calls)))
        )

    return list(await asyncio.gather(*(one(ep, turn, calls) for ep, turn, calls in work)))


def _fit(ep: Episode, budget: int, context: float) -> None:
    """End an episode whose response or context is spent (tool tokens past the budget are dropped)."""
    limit, bound = ep.record.limit(budget, context)
    if len(ep.record.ids) >= limit:
        ep.record.truncate(limit)
        ep.ended, ep.finish = bound, "length"


def generate_episodes(
    config: Config,
    engine: RolloutEngine,
    dataset: PromptDataset,
    sampling: SamplingParams,
    tools: ToolSet,
    *,
    rollout_id: int,
    indices: list[int],
    first: int,
) -> list[Sample]:
    """Multi-turn samples for the prompts at `indices` (rows of `dataset`), the first being prompt
    `first` of the rollout: `--n-samples-per-prompt` episodes per prompt, in prompt order, as
    `rollout.live.generate` numbers single-turn samples.

    Raises:
        RuntimeError: the engine failed (core/engine/client.py); core.turns.tools.ToolError: a tool call failed.
        core.turns.record.TemplateNotIncremental: the chat template cannot give exact turns.
    """
    codec = ChatCodec(dataset.tokenizer, tools.specs or None)
    budget = config.rollout.rollout_max_response_len
    context = config.agent.rollout_max_context_len or math.inf
    episodes = []
    for s in plan_samples(config, dataset, rollout_id=rollout_id, indices=indices, first=first):
        assert s.prompt.messages is not None  # the tool loop needs --apply-chat-template (core/config)
        rec = TokenRecord(prompt_length=len(s.prompt.prompt_ids), messages=list(s.prompt.messages))
        rec.add(s.prompt.prompt_ids, "prompt", 0)
        episodes.append(Episode(s.index, s.group, s.k, s.prompt, s.seed, rec))
    for turn in range(config.agent.generate_max_turns):
        active = [ep for ep in episodes if not ep.ended]
        if not active:
            break
        room = [int(min(budget - ep.response_length, context - len(ep.record.ids))) for ep in active]
        for ep, r in zip(active, room):
            if r <= 0:  # the first prompt already fills --rollout-max-context-len
                ep.ended, ep.finish = "context", "length"
        active, room = [ep for ep in active if not ep.ended], [r for r in room if r > 0]
        if not active:
            break
        requests = [
            GenerationRequest(prompt_ids=list(ep.record.ids), seed=derive_turn_seed(ep.seed, turn))
            for ep in active
        ]
        results = generate_within(engine, requests, sampling, room)
        work = []
        for ep, res in zip(active, results):
            calls = _take_reply(ep, res, codec, tools, turn)
            if calls and turn + 1 == config.agent.generate_max_turns:
                ep.ended = "max_turns"
            elif calls:
                work.append((ep, turn, calls))
        outputs = (
            run_watched(_run_calls(work, tools), timeout=tools.timeout, flag=EXECUTE_FLAG) if work else []
        )
        for (ep, _, calls), results_ in zip(work, outputs):
            messages = []
            for c, (call, result) in enumerate(zip(calls, results_)):
                call_id = _call_id(ep, turn + 1, c)  # model turn k >= 1 and the tool messages after it
                messages.append(
                    {"role": "tool", "tool_call_id": call_id, "name": call.name, "content": result}
                )
                ep.calls.append({"turn": turn + 1, "call": c, "id": call_id, "name": call.name, "arguments": call.arguments, "result": result})  # fmt: skip
            append_turn(ep.record, messages, codec.render, codec.encode, codec.decode)
            _fit(ep, budget, context)
    return [_sample(ep, codec, tools) for ep in episodes]


def _sample(ep: Episode, codec: ChatCodec, tools: ToolSet) -> Sample:
    """The training sample of a finished episode (see the module docstring)."""
    rec, P = ep.record, ep.record.prompt_length
    response = rec.ids[P:]
    kept = None
    if ep.kept:  # model tokens keep their sampling support; other tokens are their own (masked out)
        it = iter(ep.kept)
        kept = [next(it) if s == "model" else torch.tensor([t]) for s, t in zip(rec.sources[P:], response)]
    return Sample(
        index=ep.index,
        prompt_index=ep.prompt.index,
        group_index=ep.group,
        sample_index=ep.k,
        seed=ep.seed,
        prompt_ids=rec.ids[:P],
        response_ids=response,
        rollout_log_probs=torch.tensor([lp or 0.0 for lp in rec.logprobs[P:]], dtype=torch.float32),
        loss_mask=torch.tensor(rec.loss_mask(), dtype=torch.float32),
        finish_reason=ep.finish,
        prompt_text=ep.prompt.text,
        response_text=codec.content(response),
        label=ep.prompt.label,
        kept_token_ids=kept,
        weight_version=int(next((v for v in rec.weight_versions if v is not None), 0)),
        metadata=episode_metadata(
            rec,
            tools=tools.specs,
            tool_calls=ep.calls,
            parse_errors=ep.parse_errors,
            ended=ep.ended or "max_turns",
        ),
    )
