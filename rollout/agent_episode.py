"""`--custom-agent-function-path`: an agent workflow makes each sample, speaking OpenAI chat to a session.

    async def run(base_url, prompt, request_kwargs, metadata, **kw) -> reward | [reward per model turn]

Per sample a token-in/token-out session is opened on the engine's HTTP door (rollout/door.py,
serve/sessions.py; the episodes that start together open theirs in one request); `base_url` is its
OpenAI base (`.../sessions/<id>/v1`: `OpenAI(base_url=...)` posts to its `/chat/completions`),
`prompt` the prompt's chat messages, `request_kwargs` what every request passes (`model`, `temperature`, `top_p`, `max_tokens`, `seed`: the sample's seed; `extra_body` with
`top_k` when set), `metadata` the sample's label and indices. The agent sends the whole history each
turn, as agents do; the session keeps each turn's exact ids (a rewritten history is a 409). After the
agent returns, the session's token record is the sample: the first prompt, then every model reply
(loss mask 1, its log-probs and weight version), boundary tokens and the tool/user messages (mask 0).

The reward: a number, or one number per model turn (AReaL's per-interaction rewards: the sample's
reward is their sum, each kept in `metadata["agent_rewards"]`); an agent that returns anything else,
the wrong count, sends no request, raises or runs past `--agent-timeout` fails the run naming it and
the sample.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
import urllib.request
from typing import Any

import torch

from grpolab.core.batch import Sample
from grpolab.core.engine.base import SamplingParams
from grpolab.core.reward_calls import function_name
from grpolab.core.turns.episode import AGENT_REWARD, episode_metadata
from grpolab.core.turns.record import TokenRecord
from grpolab.core.turns.tools import AGENT_FLAG, call_within
from grpolab.core.turns.watched import run_watched
from grpolab.rollout.sample_plan import PlannedSample

MAX_OPEN_EPISODES = 256
"""Episodes run at once (each holds a session; `grpolab serve` keeps at most 1024 open, and the in-process
engine batches at most 256 requests): the rest wait their turn."""


def _call(url: str, method: str, body: dict | None = None) -> dict:
    """One JSON request to the door (loopback or the fleet's router); a POST sends `body` (default `{}`).

    Raises:
        RuntimeError: the server answered an HTTP error (its status and message quoted) or did not answer.
    """
    data = json.dumps(body or {}).encode() if method == "POST" else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            body = answer.read()
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")[:300]
        raise RuntimeError(f"{method} {url} answered HTTP {e.code}: {text}") from None
    except OSError as e:
        raise RuntimeError(f"{method} {url} failed: {e}") from None
    return json.loads(body) if body else {}


class SessionOpener:
    """Opens the sessions of the episodes that start together with one `POST /sessions {"count": N}`
    (serve/sessions.py) instead of N requests: the first episode to ask yields once, so every episode
    scheduled beside it joins its request. A session whose episode was cancelled while it waited is
    deleted again."""

    def __init__(self, base: str) -> None:
        self._url = f"{base}/sessions"
        self._waiting: list[asyncio.Future] = []

    async def open(self) -> str:
        """A new session's id.

        Raises:
            RuntimeError: `_call`'s, for every episode of the request.
        """
        mine = asyncio.get_running_loop().create_future()
        self._waiting.append(mine)
        if len(self._waiting) == 1:
            await asyncio.sleep(0)  # the episodes scheduled beside this one join its request
            batch, self._waiting = self._waiting, []
            try:
                opened = await asyncio.to_thread(_call, self._url, "POST", {"count": len(batch)})
                sids = opened["session_ids"]
            except Exception as e:  # every waiting episode fails with the server's answer
                for fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
            else:
                for fut, sid in zip(batch, sids):
                    if fut.done():  # cancelled while it waited: nobody will delete it
                        await asyncio.to_thread(_call, f"{self._url}/{sid}", "DELETE")
                    else:
                        fut.set_result(sid)
        return await mine


def request_kwargs(sampling: SamplingParams, seed: int, model: str) -> dict[str, Any]:
    """What an agent passes to every chat request of its sample (see the module docstring)."""
    kwargs: dict[str, Any] = {
        "model": model, "temperature": sampling.temperature, "top_p": sampling.top_p,
        "max_tokens": sampling.max_new_tokens, "seed": seed,
    }  # fmt: skip
    if sampling.top_k > 0:
        kwargs["extra_body"] = {"top_k": sampling.top_k}
    return kwargs


def _reward(value: Any, turns: int, where: str) -> tuple[float, list[float] | None]:
    """(the sample's reward, the per-turn rewards or None).

    Raises:
        RuntimeError: not a finite number or a list of `turns` finite numbers.
    """
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value), None
    if isinstance(value, list | tuple) and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value):  # fmt: skip
        if len(value) != turns:
            raise RuntimeError(f"{where}: returned {len(value)} per-turn rewards for {turns} model turns")
        return float(sum(value)), [float(v) for v in value]
    raise RuntimeError(f"{where}: returned {value!r}; a reward is a finite number or one per model turn")


def _tool_calls(messages: list[dict]) -> list[dict]:
    """Each tool call of the session's replies with its result, keyed by (model turn, call)."""
    results = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
    calls, turn = [], 0
    for m in messages:
        if m.get("role") != "assistant":
            continue
        turn += 1
        for c, call in enumerate(m.get("tool_calls") or []):
            fn = call.get("function") or {}
            calls.append({"turn": turn, "call": c, "id": call.get("id"), "name": fn.get("name"),
                          "arguments": fn.get("arguments"), "result": results.get(call.get("id"))})  # fmt: skip
    return calls


def _sample(
    record: TokenRecord,
    s: PlannedSample,
    reward: float,
    per_turn: list[float] | None,
    version: int,
    ended: str,
) -> Sample:
    P = record.prompt_length
    last = record.finish_reasons[-1] if record.finish_reasons else "stop"
    if not ended:
        ended = "length" if last == "length" else "answer"
    metadata = episode_metadata(record, tools=[], tool_calls=_tool_calls(record.messages), parse_errors=0,
                                ended=ended)  # fmt: skip
    metadata[AGENT_REWARD] = per_turn if per_turn is not None else reward
    return Sample(
        index=s.index, prompt_index=s.prompt.index, group_index=s.group, sample_index=s.k, seed=s.seed,
        prompt_ids=record.ids[:P], response_ids=record.ids[P:],
        rollout_log_probs=torch.tensor([lp or 0.0 for lp in record.logprobs[P:]], dtype=torch.float32),
        loss_mask=torch.tensor(record.loss_mask(), dtype=torch.float32),
        finish_reason="length" if last == "length" or ended != "answer" else "stop", prompt_text=s.prompt.text,
        response_text="".join(m.get("content") or "" for m in record.messages[len(s.prompt.messages or []):]),
        label=s.prompt.label, weight_version=version, metadata=metadata, reward=reward,
    )  # fmt: skip


def run_agents(
    fn: Any, bases: str | list[str], plan: list[PlannedSample], sampling: SamplingParams, timeout: float, version: int,
    max_context_len: int | None = None,
) -> list[Sample]:  # fmt: skip
    """Every planned sample's episode, all at once (their requests batch on the engine), on an event
    loop watched for an agent that blocks it (core/turns/watched.py). `bases`: the server whose
    `/sessions` the episodes use, or one per engine of a fleet (sample i's session on bases[i mod N]).

    Each request may ask for up to `sampling.max_new_tokens` (`--rollout-max-response-len`), but the
    sample keeps at most that many response tokens over all its turns, tool and boundary tokens too
    (the tool loop's budget, rollout/multi_turn.py), and at most `max_context_len` tokens in all
    (`--rollout-max-context-len`): the tokens past either are dropped and the sample ends with finish
    "length" (its `multi_turn.ended` "length" or "context"). Per-turn rewards are counted against the
    turns the agent saw, before the cut.

    Raises:
        RuntimeError: see the module docstring (naming the function, the sample, the user's file:line);
            core.turns.watched.LoopBlocked.
    """
    name = function_name(fn)
    open_episodes = asyncio.Semaphore(MAX_OPEN_EPISODES)
    bases = [bases] if isinstance(bases, str) else list(bases)
    openers = {base: SessionOpener(base) for base in bases}

    async def one(s: PlannedSample) -> Sample:
        async with open_episodes:
            return await episode(s)

    async def episode(s: PlannedSample) -> Sample:
        sample = f"sample {s.index} (group {s.group}, prompt row {s.prompt.index})"
        where = f"{AGENT_FLAG} {name} on {sample}"
        base = bases[s.index % len(bases)]  # a session lives on one engine: sample i on engine i mod N
        sid = await openers[base].open()
        try:
            metadata = {
                "label": s.prompt.label,
                "index": s.index,
                "group_index": s.group,
                "row": s.prompt.index,
            }
            kwargs = request_kwargs(sampling, s.seed, "grpolab")
            try:
                value = await call_within(fn, (f"{base}/sessions/{sid}/v1", list(s.prompt.messages or []),
                                               kwargs, metadata), timeout=timeout, flag=AGENT_FLAG, where=sample)  # fmt: skip
            except RuntimeError as e:  # the session's reason, which the agent's own client may not show
                refused = (await asyncio.to_thread(_call, f"{base}/sessions/{sid}", "GET")).get("last_error")
                if refused is None:
                    raise
                raise RuntimeError(f"{e}; its session refused the last turn: {refused}") from e
            record = TokenRecord.from_json(await asyncio.to_thread(_call, f"{base}/sessions/{sid}", "GET"))
        finally:
            await asyncio.to_thread(_call, f"{base}/sessions/{sid}", "DELETE")
        if not record.finish_reasons:
            raise RuntimeError(
                f"{where}: the agent sent no chat request to its session ({base}/sessions/{sid}/v1)"
            )
        reward, per_turn = _reward(value, record.model_turns, where)
        limit, bound = record.limit(sampling.max_new_tokens, max_context_len)
        ended = bound if record.truncate(limit) else ""
        return _sample(record, s, reward, per_turn, version, ended)

    async def every() -> list[Sample]:
        return list(await asyncio.gather(*(one(s) for s in plan)))

    return run_watched(every(), timeout=timeout, flag=AGENT_FLAG)
