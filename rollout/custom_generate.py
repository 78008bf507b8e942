"""`--custom-generate-function-path`: a user's generate function makes each sample (Miles' contract).

    async def generate(args, sample, sampling_params) -> sample

`args` holds every `grpolab train` flag by its Miles attribute name (`args.hf_checkpoint`,
`args.generate_max_turns`, ...) with `args.sglang_router_ip` / `args.sglang_router_port` pointing at
the engine (rollout/door.py: the fleet's router, or the run's own engine on 127.0.0.1);
`sample` is a `GenerateSample` (Miles' `Sample` fields: `tokens` holds the prompt ids, `prompt` the
chat messages with --apply-chat-template, else the prompt text); `sampling_params` is SGLang's
`sampling_params` object with the sample's `sampling_seed`. The function fills `tokens`, `response`,
`response_length`, `loss_mask` (None: every response token trains) and `rollout_log_probs` and sets
`status`; its `metadata["messages"]` (Miles' trajectory) lets `grpolab check turns` audit the turns.

Every returned sample is checked before training, naming the function and the sample:
`len(loss_mask) == len(rollout_log_probs) == response_length <= len(tokens)`, a status of COMPLETED or
TRUNCATED, JSON metadata. A sample whose mask has zeros is recorded as multi-turn: its model replies
are the runs of ones (core/turns/episode.py), so the recording and the auditor see its turns.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
from dataclasses import dataclass, field
from typing import Any

import torch

from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.data import PromptDataset
from grpolab.core.engine.base import RolloutEngine, SamplingParams
from grpolab.core.reward_calls import function_name
from grpolab.core.turns.episode import KEY
from grpolab.core.turns.tools import GENERATE_FLAG as FLAG
from grpolab.core.turns.tools import call_within
from grpolab.core.turns.watched import run_watched
from grpolab.rollout.agent_episode import run_agents
from grpolab.rollout.door import engine_door, session_bases
from grpolab.rollout.sample_plan import PlannedSample, plan_samples


class Status(enum.Enum):
    """Miles' `Sample.Status` names."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class GenerateSample:
    """The sample a generate function fills (Miles' `Sample` fields; see the module docstring).

    Attributes:
        index / group_index: the sample's place in the rollout; seed: its sampling seed.
        prompt: the chat messages (with --apply-chat-template) or the prompt text.
        tokens: the prompt ids on entry; prompt + response ids on return.
        response / response_length: the response text and its tokens (the tail of `tokens`).
        loss_mask: per response token 1 (trained) or 0, or None for all 1.
        rollout_log_probs: per response token the engine's log-prob (0.0 where the engine did not
            generate it).
        status: COMPLETED (finish "stop") or TRUNCATED (finish "length") on return.
    """

    index: int
    group_index: int
    seed: int
    prompt: Any
    label: str
    tokens: list[int]
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    reward: float | None = None
    metadata: dict = field(default_factory=dict)

    Status = Status  # Miles code writes `sample.Status.COMPLETED` / `Sample.Status.TRUNCATED`


def miles_args(config: Config, host: str, port: int) -> argparse.Namespace:
    """Every flag of `config` by its attribute name, the router address set to the door."""
    flat = {k: v for section in config.to_dict().values() for k, v in section.items()}
    flat.update(sglang_router_ip=host, sglang_router_port=port, partial_rollout=False)
    return argparse.Namespace(**flat)


def sampling_params(sampling: SamplingParams, seed: int) -> dict[str, Any]:
    """SGLang's `sampling_params` for one sample (top_k -1 disables, as SGLang reads it)."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "max_new_tokens": sampling.max_new_tokens,
        "stop_token_ids": list(sampling.stop_token_ids),
        "sampling_seed": seed,
    }


def _generate_sample(s: PlannedSample) -> GenerateSample:
    prompt = s.prompt.messages if s.prompt.messages is not None else s.prompt.text
    return GenerateSample(
        index=s.index, group_index=s.group, seed=s.seed, prompt=prompt, label=s.prompt.label,
        tokens=list(s.prompt.prompt_ids),
    )  # fmt: skip


def _problems(g: Any) -> list[str]:
    """What is wrong with a returned sample ([] when it can train)."""
    if not isinstance(g, GenerateSample):
        return [f"returned {type(g).__name__}, not the sample it was given"]
    R, out = g.response_length, []
    if not isinstance(R, int) or not 0 <= R <= len(g.tokens):
        return [f"response_length {R!r} is not in 0..len(tokens) ({len(g.tokens)})"]
    for name in ("loss_mask", "rollout_log_probs"):
        values = getattr(g, name)
        if name == "loss_mask" and values is None:
            continue
        if not isinstance(values, list) or len(values) != R:
            n = len(values) if isinstance(values, list) else values
            out.append(f"len({name}) = {n} but response_length = {R}")
    if g.loss_mask is not None and any(m not in (0, 1) for m in g.loss_mask):
        out.append("loss_mask holds values other than 0 and 1")
    if g.status not in (Status.COMPLETED, Status.TRUNCATED):
        out.append(f"status is {g.status}, not COMPLETED or TRUNCATED")
    try:
        json.dumps(g.metadata)
    except (TypeError, ValueError) as e:
        out.append(f"metadata is not JSON ({e})")
    return out


def _episode(mask: list[int], finish: str, version: int) -> dict[str, Any]:
    """The multi-turn record of a sample whose mask has zeros: model replies are the runs of ones."""
    spans: list[list] = []
    turn = 0
    for m in mask:
        source = "model" if m else "context"
        if spans and spans[-1][0] == source:
            spans[-1][2] += 1
            continue
        turn += source == "model"  # model reply k and the context after it are turn k
        spans.append([source, turn, 1])
    replies = [n for source, _, n in spans if source == "model"]
    return {
        "spans": spans,
        "weight_versions": [version] * len(replies),
        "finish_reasons": ["stop"] * (len(replies) - 1) + [finish] if replies else [],
        "reply_lengths": replies,  # the function's tool calls are its own: not counted in rollout/tool_calls
        "ended": "length" if finish == "length" else "answer",
    }


def to_sample(g: GenerateSample, s: PlannedSample, version: int) -> Sample:
    """The training sample of a generate function's result (checked by the caller, `_problems`)."""
    R = g.response_length
    mask = [1] * R if g.loss_mask is None else list(g.loss_mask)
    finish = "length" if g.status is Status.TRUNCATED else "stop"
    metadata = dict(g.metadata)
    if 0 in mask or "messages" in metadata:
        metadata[KEY] = _episode(mask, finish, version)
    cut = len(g.tokens) - R
    return Sample(
        index=s.index, prompt_index=s.prompt.index, group_index=s.group, sample_index=s.k, seed=s.seed,
        prompt_ids=list(g.tokens[:cut]), response_ids=list(g.tokens[cut:]),
        rollout_log_probs=torch.tensor([float(x) for x in g.rollout_log_probs or []], dtype=torch.float32),
        loss_mask=torch.tensor(mask, dtype=torch.float32), finish_reason=finish, prompt_text=s.prompt.text,
        response_text=str(g.response), label=s.prompt.label, weight_version=version, metadata=metadata,
    )  # fmt: skip


async def run_generate(
    fn: Any, args: argparse.Namespace, plan: list[PlannedSample], sampling: SamplingParams, timeout: float
) -> list[GenerateSample]:
    """Every planned sample through `fn` concurrently.

    Raises:
        RuntimeError: a call raised or ran past `timeout` seconds (naming the function, the sample and
            the user's file:line).
    """

    async def one(s: PlannedSample) -> GenerateSample:
        where = f"sample {s.index} (group {s.group}, prompt row {s.prompt.index})"
        call = (args, _generate_sample(s), sampling_params(sampling, s.seed))
        return await call_within(fn, call, timeout=timeout, flag=FLAG, where=where)

    return list(await asyncio.gather(*(one(s) for s in plan)))


def checked_samples(
    fn: Any, results: list[GenerateSample], plan: list[PlannedSample], version: int
) -> list[Sample]:
    """The training samples of `results`.

    Raises:
        RuntimeError: a returned sample breaks the contract (naming the function, the sample, the problem).
    """
    out = []
    for g, s in zip(results, plan):
        problems = _problems(g)
        if problems:
            raise RuntimeError(f"{FLAG} {function_name(fn)} on sample {s.index}: " + "; ".join(problems))
        out.append(to_sample(g, s, version))
    return out


@dataclass
class CustomGeneration:
    """A run's `--custom-generate-function-path` or `--custom-agent-function-path` function, with what
    its rollouts need: `flag` names which, `fingerprint` is the model's (the in-process door reports it).
    """

    config: Config
    flag: str
    fn: Any
    fingerprint: str

    def generate(
        self, engine: RolloutEngine, dataset: PromptDataset, sampling: SamplingParams, *, rollout_id: int,
        indices: list[int], first: int,
    ) -> list[Sample]:  # fmt: skip
        """This share's samples, each made by the user's function through the engine's door.

        Raises:
            RuntimeError: the function failed or broke its contract (naming it and the sample).
        """
        plan = plan_samples(self.config, dataset, rollout_id=rollout_id, indices=indices, first=first)
        version = engine.health().weight_version
        timeout = self.config.agent.agent_timeout
        door = engine_door(self.config, engine, dataset.tokenizer, sampling, self.fingerprint, version)
        with door as (host, port):
            if self.flag == FLAG:
                args = miles_args(self.config, host, port)
                results = run_watched(
                    run_generate(self.fn, args, plan, sampling, timeout), timeout=timeout, flag=FLAG
                )
                return checked_samples(self.fn, results, plan, version)
            context = self.config.agent.rollout_max_context_len
            bases = session_bases(engine, f"http://{host}:{port}")
            return run_agents(self.fn, bases, plan, sampling, timeout, version, context)
