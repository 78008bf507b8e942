"""A multi-turn session's exact token record: each turn's prompt is the last turn's ids plus only the
newly appended messages, tokenised (pure: the chat template, encoder and decoder are passed in).

Why: an agent sends the whole message history each turn; re-tokenising it is not the ids the policy
sampled (decode -> encode is not a bijection, and a template emits boundary tokens the model never
generated, such as Qwen's `\\n` after `<|im_end|>`), so a trainer fed re-tokenised history trains on
ids the policy never produced (the Miles-101 manual: keep the tokens of each turn exact).

The rule, per turn k >= 1 (turn 0 is the first prompt):
1. The request's history must be the session's: every earlier message as it was sent, then the
   assistant reply this session gave (content, tool calls); anything else is a `HistoryRewrite`
   naming the first differing message (the server answers 409), never silently re-tokenised.
2. The end of the assistant turn is closed with the template's own text after an assistant message
   (found by rendering a probe message), less what the model already generated: a reply that ended
   in `<|im_end|>` gets `\\n` (source `boundary`); one cut by the length limit gets `<|im_end|>\\n`.
3. Each new message's text is what the template adds for it (the rendering with it minus the
   rendering without it), tokenised alone (source: its role); the generation prompt is `boundary`.
   A template whose rendering of the earlier turns changes once a message follows cannot give exact
   turns: `TemplateNotIncremental`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PROBE = "\x00grpolab-probe\x00"
"""A content no message holds, to find the template's text around an assistant message."""

Render = Callable[[list, bool], str]
"""(messages, add_generation_prompt) -> the chat template's text."""


class HistoryRewrite(ValueError):
    """The request's history is not the session's (HTTP 409). `turn` is the differing message's index."""

    def __init__(self, message: str, *, turn: int) -> None:
        super().__init__(message)
        self.turn = turn


class TemplateNotIncremental(ValueError):
    """The chat template renders earlier turns differently once a message follows (HTTP 400)."""


@dataclass
class TokenRecord:
    """Every token of a session, in order.

    Attributes:
        ids: all token ids (first prompt, then per turn: model reply, boundary, new messages, gen prompt).
        sources: per token: "prompt", "model", "boundary", or the role of the message it renders
            ("user", "tool", "system", ...).
        turns: per token, its turn (0: the first prompt; model turn k's reply and what follows it: k).
        logprobs: per token, the engine's log-prob for model tokens, None otherwise.
        weight_versions: per token, the weight version that generated it (model tokens), None otherwise.
        prompt_length: tokens of the first prompt (the "response" of a trajectory is what follows).
        messages: the history as of the last reply (the last request's messages + the reply).
        finish_reasons: per model turn, its finish reason.
        reply_lengths: per model turn, its reply's tokens.
        assistant_tail: the template's text after an assistant message (None until a turn needs it).
    """

    ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    weight_versions: list[str | None] = field(default_factory=list)
    prompt_length: int = 0
    messages: list[dict] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    reply_lengths: list[int] = field(default_factory=list)
    assistant_tail: str | None = None

    @property
    def model_turns(self) -> int:
        """Replies generated so far."""
        return len(self.finish_reasons)

    def add(self, ids: Sequence[int], source: str, turn: int, logprobs: Sequence[float] | None = None,
            version: str | None = None) -> None:  # fmt: skip
        """Append tokens of one source (model tokens carry their log-probs and weight version)."""
        self.ids += list(ids)
        self.sources += [source] * len(ids)
        self.turns += [turn] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [None] * len(ids)
        self.weight_versions += [version] * len(ids)

    def copy(self) -> TokenRecord:
        """A copy whose lists can grow without touching this record (the messages are shared, unchanged)."""
        return TokenRecord(
            ids=list(self.ids), sources=list(self.sources), turns=list(self.turns), logprobs=list(self.logprobs),
            weight_versions=list(self.weight_versions), prompt_length=self.prompt_length,
            messages=list(self.messages), finish_reasons=list(self.finish_reasons),
            reply_lengths=list(self.reply_lengths), assistant_tail=self.assistant_tail,
        )  # fmt: skip

    def limit(self, max_response: int, max_context: float | None) -> tuple[int, str]:
        """(tokens the record may hold, what bounds it): the prompt plus `max_response` response tokens
        (`--rollout-max-response-len`: "length"), or `max_context` when that is smaller
        (`--rollout-max-context-len`: "context")."""
        budget = self.prompt_length + max_response
        if max_context is not None and max_context < budget:
            return int(max_context), "context"
        return budget, "length"

    def truncate(self, limit: int) -> bool:
        """Keep only the first `limit` tokens (a response budget or context cap spent); whether any
        were dropped. A model turn cut short ends with finish "length"; turns cut away entirely leave
        `finish_reasons`, `reply_lengths` and the messages (their assistant message and all after it).
        A message cut short stays as it was sent (the auditor names the cut as truncation)."""
        if len(self.ids) <= limit:
            return False
        for name in ("ids", "sources", "turns", "logprobs", "weight_versions"):
            del getattr(self, name)[limit:]
        kept = [0] * self.model_turns
        for source, turn in zip(self.sources, self.turns):
            if source == "model":
                kept[turn - 1] += 1
        while kept and kept[-1] == 0:
            kept.pop()
        if kept and kept[-1] < self.reply_lengths[len(kept) - 1]:
            self.finish_reasons[len(kept) - 1] = "length"
        gone = self.model_turns - len(kept)
        if gone:  # the last model_turns assistant messages are the replies; drop from the first gone
            replies = [i for i, m in enumerate(self.messages) if m.get("role") == "assistant"]
            self.messages = self.messages[: replies[-gone]]
        self.finish_reasons, self.reply_lengths = self.finish_reasons[: len(kept)], kept
        return True

    def loss_mask(self) -> list[int]:
        """Over the response (everything after the first prompt): 1 for model tokens, 0 otherwise."""
        return [1 if s == "model" else 0 for s in self.sources[self.prompt_length :]]

    def as_json(self) -> dict:
        """The record in JSON (GET /sessions/<id>): ids, sources, turns, loss mask, log-probs, versions."""
        mask = self.loss_mask()
        return {
            "input_ids": self.ids,
            "prompt_length": self.prompt_length,
            "response_length": len(mask),
            "sources": self.sources,
            "turns": self.turns,
            "loss_mask": mask,
            "logprobs": self.logprobs,
            "weight_versions": self.weight_versions,
            "num_turns": self.model_turns,
            "trainable_tokens": sum(mask),
            "finish_reasons": self.finish_reasons,
            "reply_lengths": self.reply_lengths,
            "messages": self.messages,
        }

    @classmethod
    def from_json(cls, data: dict) -> TokenRecord:
        """The record `as_json` wrote (GET /sessions/<id>).

        Raises:
            ValueError: a per-token list whose length is not the ids', or a missing field (named).
        """
        try:
            ids = [int(t) for t in data["input_ids"]]
            record = cls(
                ids=ids, sources=list(data["sources"]), turns=[int(t) for t in data["turns"]],
                logprobs=list(data["logprobs"]), weight_versions=list(data["weight_versions"]),
                prompt_length=int(data["prompt_length"]), messages=list(data["messages"]),
                finish_reasons=list(data["finish_reasons"]), reply_lengths=[int(n) for n in data["reply_lengths"]],
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a session token record ({type(e).__name__}: {e})") from e
        for name in ("sources", "turns", "logprobs", "weight_versions"):
            if len(getattr(record, name)) != len(ids):
                raise ValueError(
                    f"the record's {name} has {len(getattr(record, name))} entries for {len(ids)} ids"
                )
        return record


COMPARED_APART = ("role", "content", "tool_calls", "tool_call_id")
"""Message keys `_same_message` compares by their own rule; every other key is compared as it is."""


def _same_message(sent: dict, kept: dict) -> bool:
    """Whether a history message is the one the session holds: role, content (None as ""), tool-call
    names and arguments, tool_call_id, and every other key with a value (a `name` added to an earlier
    message is a rewrite: a chat template may render it). Keys a client library adds empty (`refusal`,
    `annotations`, `audio`, `function_call` as null) do not count, nor a tool call's `id` and `type`."""

    def calls(m: dict) -> list:
        return [
            (c.get("function", {}).get("name"), c.get("function", {}).get("arguments"))
            for c in m.get("tool_calls") or []
        ]

    def others(m: dict) -> dict:
        return {k: v for k, v in m.items() if k not in COMPARED_APART and v not in (None, "", [], {})}

    return (
        sent.get("role") == kept.get("role")
        and (sent.get("content") or "") == (kept.get("content") or "")
        and calls(sent) == calls(kept)
        and sent.get("tool_call_id") == kept.get("tool_call_id")
        and others(sent) == others(kept)
    )


def new_messages(record: TokenRecord, messages: list[dict]) -> list[dict]:
    """The messages a turn appends to the session's history.

    Raises:
        HistoryRewrite: an earlier message differs or is missing, or nothing new was appended.
    """
    kept = record.messages
    for i, m in enumerate(kept):
        if i >= len(messages):
            raise HistoryRewrite(
                f"the history has {len(messages)} messages but the session holds {len(kept)}: a session's "
                "history only grows (send every earlier message and the session's replies)", turn=i
            )  # fmt: skip
        if not _same_message(messages[i], m):
            what = "the session's reply" if m.get("role") == "assistant" else "the message sent then"
            raise HistoryRewrite(
                f"messages[{i}] ({messages[i].get('role')}) differs from {what}: a session keeps the exact tokens "
                "of every turn, so an earlier message cannot be rewritten (open a new session)", turn=i
            )  # fmt: skip
    added = messages[len(kept) :]
    if not added:
        raise HistoryRewrite("the request appends no message to the session's history", turn=len(kept))
    return added


def _assistant_tail(render: Render, history: list[dict]) -> str:
    """The template's text after an assistant message's content (Qwen: `<|im_end|>\\n`)."""
    text = render(history + [{"role": "assistant", "content": PROBE}], False)
    return text[text.rindex(PROBE) + len(PROBE) :]


def close_reply(record: TokenRecord, render: Render, decode: Callable[[Sequence[int]], str]) -> str:
    """The text that ends the last reply the way the template ends an assistant turn, less the
    template text the model generated itself (its EOS): Qwen `\n` after `<|im_end|>`. Call it while
    the record ends with that reply."""
    if record.assistant_tail is None:  # the template's, found once per session
        record.assistant_tail = _assistant_tail(render, record.messages[:-1])
    tail = record.assistant_tail
    generated = (
        decode(record.ids[len(record.ids) - record.reply_lengths[-1] :]) if record.reply_lengths[-1] else ""
    )
    for k in range(len(tail), 0, -1):  # the longest start of the tail the reply already ends with
        if generated.endswith(tail[:k]):
            return tail[k:]
    return tail


def append_turn(
    record: TokenRecord, added: list[dict], render: Render, encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
) -> None:  # fmt: skip
    """Append the boundary after the last reply, each new message's tokens and the generation prompt.

    Raises:
        TemplateNotIncremental: the template's text for the history is not a prefix of its text once
            the new messages follow (naming the first message whose rendering changed).
    """
    turn = record.model_turns
    history = list(record.messages)
    boundary = close_reply(record, render, decode)
    if boundary:
        record.add(encode(boundary), "boundary", turn)
    before = render(history, False)
    for m in added:
        after = render(history + [m], False)
        if not after.startswith(before):
            raise TemplateNotIncremental(
                f"the chat template renders the earlier turns differently once messages[{len(history)}] "
                f"({m.get('role')}) follows them, so the session cannot keep each turn's exact tokens"
            )
        record.add(encode(after[len(before) :]), str(m.get("role")), turn)
        history.append(m)
        before = after
    prompt = render(history, True)
    if not prompt.startswith(before):
        raise TemplateNotIncremental("the chat template's generation prompt rewrites the history before it")
    record.add(encode(prompt[len(before) :]), "boundary", turn)
    record.messages = history


def add_reply(record: TokenRecord, ids: Sequence[int], logprobs: Sequence[float], version: str,
              message: dict, finish_reason: str) -> None:  # fmt: skip
    """Record a model reply: its exact ids (source "model"), log-probs, weight version, and the
    assistant message the server answered with (what the next turn's history must hold)."""
    turn = record.model_turns + 1
    record.add(ids, "model", turn, logprobs, version)
    record.messages = record.messages + [message]
    record.finish_reasons.append(finish_reason)
    record.reply_lengths.append(len(ids))
