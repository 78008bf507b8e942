"""A multi-turn sample's record in its metadata: the one writer and reader of `metadata["multi_turn"]`.

A multi-turn sample is one `Sample` whose response is every token after the first prompt: model turns
(loss mask 1), the template's boundary tokens and the tool / user messages (mask 0). Its metadata
holds what a replay, `grpolab check turns` and the Rollouts page need (JSON, so a recording carries it):

- `messages`: the conversation, each assistant message's content the model's own text (tool-call
  markup inline, as Miles' trajectories keep it), each tool message with its `tool_call_id`;
- `tools`: the tool specs the template rendered the prompt with (absent when none);
- `multi_turn`: `spans` ([source, turn, tokens] runs over the response: core/turns/record.py's
  sources), `weight_versions` and `finish_reasons` and `reply_lengths` per model turn, `tool_calls`
  (turn, call, name, arguments, result: each result keyed by (turn, call)), `tool_parse_errors`,
  `ended` (why the episode stopped: "answer", "max_turns", "length", "context").
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from grpolab.core.turns.record import TokenRecord

KEY = "multi_turn"
AGENT_REWARD = "agent_rewards"
"""Metadata key of an agent workflow's reward: a number, or one per model turn (rollout/agent_episode.py)."""
ENDINGS = ("answer", "max_turns", "length", "context")
"""Why an episode stopped: a reply called no tool; the turn limit; the response budget; the context cap."""


def _version(text: str | None) -> int:
    """A token's weight version as the int recordings keep: SGLang's string when it is a number
    ("3"), else 0 (a server's initial "default")."""
    return int(text) if text is not None and str(text).strip().isdigit() else 0


def episode_metadata(
    record: TokenRecord, *, tools: list[dict], tool_calls: list[dict], parse_errors: int, ended: str
) -> dict[str, Any]:
    """A sample's metadata for the episode `record` holds (see the module docstring)."""
    P = record.prompt_length
    spans = [
        [source, turn, len(list(run))]
        for (source, turn), run in groupby(zip(record.sources[P:], record.turns[P:]))
    ]
    versions = [_version(v) for v, s in zip(record.weight_versions, record.sources) if s == "model"]
    per_turn = [
        versions[sum(record.reply_lengths[:k])] if n else 0 for k, n in enumerate(record.reply_lengths)
    ]
    out: dict[str, Any] = {
        "messages": record.messages,
        KEY: {
            "spans": spans,
            "weight_versions": per_turn,
            "finish_reasons": record.finish_reasons,
            "reply_lengths": record.reply_lengths,
            "tool_calls": tool_calls,
            "tool_parse_errors": parse_errors,
            "ended": ended,
        },
    }
    if tools:
        out["tools"] = tools
    return out


def episode_of(metadata: dict | None) -> dict | None:
    """The `multi_turn` part of a sample's metadata, or None for a single-turn sample."""
    if not isinstance(metadata, dict):
        return None
    part = metadata.get(KEY)
    return part if isinstance(part, dict) else None


def response_sources(episode: dict) -> list[tuple[str, int]]:
    """(source, turn) of every response token, from the episode's spans.

    Raises:
        ValueError: the spans are not [source: str, turn: int, tokens: int >= 0] triples.
    """
    out: list[tuple[str, int]] = []
    for i, span in enumerate(episode.get("spans") or []):
        ok = isinstance(span, list) and len(span) == 3 and isinstance(span[0], str)
        if not ok or not all(isinstance(x, int) and x >= 0 for x in span[1:]):
            raise ValueError(f"multi_turn.spans[{i}] is not [source, turn, tokens]: {span!r}")
        out += [(span[0], span[1])] * span[2]
    return out


def episode_counts(samples_metadata: list[dict | None]) -> dict[str, float]:
    """`rollout/num_turns`, `rollout/tool_calls` (means per sample) and `rollout/tool_parse_errors` (the
    rollout's count) over multi-turn samples' metadata; {} when none is multi-turn. The tool figures
    count the episodes that record their calls (the tool loop, agents; not a custom generate function)."""
    episodes = [e for e in map(episode_of, samples_metadata) if e is not None]
    if not episodes:
        return {}
    out = {"rollout/num_turns": sum(len(e.get("finish_reasons") or []) for e in episodes) / len(episodes)}
    known = [e for e in episodes if isinstance(e.get("tool_calls"), list)]  # a custom function's are its own
    if known:
        out["rollout/tool_calls"] = sum(len(e["tool_calls"]) for e in known) / len(known)
    parsed = [e for e in episodes if "tool_parse_errors" in e]
    if parsed:
        out["rollout/tool_parse_errors"] = float(sum(int(e["tool_parse_errors"] or 0) for e in parsed))
    return out


def agent_reward(metadata: dict | None) -> float | None:
    """The reward an agent workflow returned for its sample (per-turn rewards summed), or None."""
    value = metadata.get(AGENT_REWARD) if isinstance(metadata, dict) else None
    if isinstance(value, list):
        return float(sum(value))
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
