"""The drift auditor: does a multi-turn sample's token record hold the template's tokens between turns?

A trainer must score exactly the ids the policy produced; between the model's replies every token is
the chat template's (its boundary tokens, the tool and user messages). The audit re-renders the
sample's conversation (`metadata["messages"]`, Miles' trajectory key) with the chat template, with
each assistant message's content replaced by a probe, and splits the rendering at the probes: what
lies between two probes is the template's text between two replies. It is compared, per turn
boundary, with the recorded ids there (the model's own ids are taken as they are: they are the
policy's). This is independent of the way the tool loop builds its record (core/turns/record.py
appends segment by segment; here the whole conversation is rendered at once), so a generator that
drops Qwen's `\\n` after `<|im_end|>` (verl #6501, Miles' `tokenize_tool_responses`) or re-tokenises
a tool turn fails it.

Findings (`Finding.severity`):
- "error": a broken invariant (`len(loss_mask) != response length`, a trainable tool/user/template
  token, spans that do not add up, model spans that do not match the assistant messages) or a turn
  boundary whose ids are not the template's, with its cause: "template boundary token" (the
  template's text after a reply is missing or extra, e.g. the `\\n`), "truncation" (a reply cut by the
  length limit not closed the template's way), "message text" (a tool or user message's tokens are
  not its text's), "tokenization" (the same text, other ids: the boundary was tokenised otherwise);
- "drift": a hazard, not a defect of the record: the model's ids at a turn are not what encoding
  their text gives ("decode/encode drift"), or the message holds other text than the model wrote
  ("tool-parser rewrite"); a trainer that re-tokenises the history would train on other ids there.

Pure: the tokenizer comes in as a `ChatCodec`; `audit_sample` returns findings, nothing is printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpolab.checkers.errors import CheckFailure
from grpolab.core.batch import Sample
from grpolab.core.turns.codec import ChatCodec
from grpolab.core.turns.episode import episode_of, response_sources

PROBE = "\x00grpolab-turn-{}\x00"
"""A content no message holds; `{}` is the assistant message's number."""
WINDOW = 4
"""Tokens shown on each side of a divergence."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One problem of one sample.

    Attributes:
        sample: the sample's `index` in its rollout; turn: the model turn it follows (0: the prompt).
        severity: "error" or "drift" (see the module docstring); cause: what broke.
        position: the response position of the first divergent token (-1 when not one token).
        recorded / expected: ids around the divergence (the record's, the template's).
        recorded_text / expected_text: their text.
        detail: one sentence.
    """

    sample: int
    turn: int
    severity: str
    cause: str
    detail: str
    position: int = -1
    recorded: list[int] = field(default_factory=list)
    expected: list[int] = field(default_factory=list)
    recorded_text: str = ""
    expected_text: str = ""

    def as_json(self) -> dict:
        """The finding as a JSON object (`grpolab check turns --json`)."""
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class SampleAudit:
    """The audit of one multi-turn sample: its findings and trainable tokens per model turn."""

    sample: int
    turns: int
    trainable_per_turn: list[int]
    findings: list[Finding]


def _spans(sources: list[tuple[str, int]]) -> list[tuple[str, int, int, int]]:
    """Runs of (source kind, turn, start, end) over the response; kind "model" or "context"."""
    runs: list[tuple[str, int, int, int]] = []
    for r, (source, turn) in enumerate(sources):
        kind = "model" if source == "model" else "context"
        if runs and runs[-1][0] == kind and (kind == "context" or runs[-1][1] == turn):
            runs[-1] = (kind, runs[-1][1], runs[-1][2], r + 1)
        else:
            runs.append((kind, turn, r, r + 1))
    return runs


def _first_diff(a: list[int], b: list[int]) -> int:
    """The first index where `a` and `b` differ (the shorter length when one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _probe_pieces(codec: ChatCodec, messages: list[dict]) -> tuple[list[str], bool]:
    """The template's text around each assistant message ([before the first, between 1 and 2, ...,
    after the last]) and whether the rendering ended with a generation prompt."""
    probed, n = [], 0
    for m in messages:
        if m.get("role") == "assistant":
            probed.append({"role": "assistant", "content": PROBE.format(n)})
            n += 1
        else:
            probed.append(m)
    open_end = bool(messages) and messages[-1].get("role") != "assistant"
    text = codec.render(probed, open_end)
    pieces = []
    for i in range(n):
        head, _, text = text.partition(PROBE.format(i))
        pieces.append(head)
    return [*pieces, text], open_end


def _boundary_cause(recorded_text: str, expected_text: str, truncated: bool) -> str:
    """Why a turn boundary's ids differ (see the module docstring)."""
    if recorded_text == expected_text:
        return "tokenization"
    if truncated:
        return "truncation"
    if expected_text.find(recorded_text) > 0 or recorded_text.find(expected_text) > 0:
        return "template boundary token"  # the template's text before the next message, missing or extra
    return "message text"


def audit_sample(sample: Sample, codec: ChatCodec) -> SampleAudit | None:
    """Audit one sample (None when it is not multi-turn: no `multi_turn` record in its metadata).

    `codec` must hold the tools the prompt was rendered with (`metadata["tools"]`); `audit_samples`
    builds it per sample.
    """
    episode = episode_of(sample.metadata)
    if episode is None:
        return None
    i, R = sample.index, len(sample.response_ids)
    found: list[Finding] = []

    def error(turn: int, cause: str, detail: str, **kw) -> None:
        found.append(Finding(sample=i, turn=turn, severity="error", cause=cause, detail=detail, **kw))

    try:
        sources = response_sources(episode)
    except ValueError as e:
        error(0, "record", str(e))
        return SampleAudit(sample=i, turns=0, trainable_per_turn=[], findings=found)
    mask = [float(m) for m in sample.loss_mask.tolist()]
    if len(mask) != R:
        error(0, "loss mask", f"len(loss_mask) {len(mask)} != response length {R}")
    if len(sources) != R:
        error(0, "record", f"the spans cover {len(sources)} tokens but the response has {R}")
        return SampleAudit(sample=i, turns=0, trainable_per_turn=[], findings=found)
    trainable: dict[int, int] = {}
    for r, ((source, turn), m) in enumerate(zip(sources, mask)):
        if m > 0 and source != "model":
            error(turn, "loss mask", f"response token {r} ({source}, turn {turn}) is trainable: only model tokens may be", position=r)  # fmt: skip
            break
        if source == "model" and m > 0:
            trainable[turn] = trainable.get(turn, 0) + 1
    runs = _spans(sources)
    replies = [(s, e) for kind, _, s, e in runs if kind == "model"]
    messages = sample.metadata.get("messages") or []
    assistants = [m for m in messages if m.get("role") == "assistant"]
    turns = len(replies)
    if len(assistants) != turns:
        error(0, "record", f"{turns} model replies in the ids but {len(assistants)} assistant messages")
        return SampleAudit(sample=i, turns=turns, trainable_per_turn=[], findings=found)
    pieces, open_end = _probe_pieces(codec, messages)
    prompt = codec.encode(pieces[0])
    if prompt != list(sample.prompt_ids):
        d = _first_diff(prompt, list(sample.prompt_ids))
        error(0, "prompt", f"the prompt ids differ from the template's rendering at prompt token {d}",
              recorded=list(sample.prompt_ids)[max(0, d - WINDOW) : d + WINDOW], expected=prompt[max(0, d - WINDOW) : d + WINDOW])  # fmt: skip
    response = list(sample.response_ids)
    finishes = episode.get("finish_reasons") or []
    for k, (start, end) in enumerate(replies):
        turn, reply = k + 1, response[start:end]
        text = codec.content(reply)
        if codec.encode(codec.decode(reply)) != reply:
            found.append(Finding(sample=i, turn=turn, severity="drift", cause="decode/encode drift", position=start,
                                 detail="encoding the reply's text gives other ids than the model sampled: a trainer that "
                                 "re-tokenises the history trains on other ids here"))  # fmt: skip
        if (assistants[k].get("content") or "") != text:
            found.append(Finding(sample=i, turn=turn, severity="drift", cause="tool-parser rewrite", position=start,
                                 detail="the assistant message holds other text than the model wrote: re-rendering the "
                                 "history gives other tokens here"))  # fmt: skip
        last = k + 1 == turns
        if last and not open_end:
            continue  # the record ends with the last reply; the template's tail after it is not trained
        after = end
        following = replies[k + 1][0] if not last else R
        piece, generated = pieces[k + 1], codec.decode(reply)
        cut = next((n for n in range(len(piece), 0, -1) if generated.endswith(piece[:n])), 0)
        expected = codec.encode(piece[cut:])
        recorded = response[after:following]
        if last and len(recorded) < len(expected) and expected[: len(recorded)] == recorded:
            continue  # the response budget cut the last tool turn (`ended` "length"/"context")
        if recorded != expected:
            d = _first_diff(recorded, expected)
            rt, et = codec.decode(recorded), codec.decode(expected)
            truncated = cut == 0 and k < len(finishes) and finishes[k] == "length"  # no EOS of its own
            error(turn, _boundary_cause(rt, et, truncated),
                  f"after model turn {turn} the record holds {len(recorded)} tokens where the template has {len(expected)}",
                  position=after + d, recorded=recorded[max(0, d - WINDOW) : d + WINDOW],
                  expected=expected[max(0, d - WINDOW) : d + WINDOW], recorded_text=rt[:200], expected_text=et[:200])  # fmt: skip
    per_turn = [trainable.get(t, 0) for t in range(1, turns + 1)]
    return SampleAudit(sample=i, turns=turns, trainable_per_turn=per_turn, findings=found)


def audit_samples(samples: list[Sample], tokenizer: object) -> list[SampleAudit]:
    """`audit_sample` over the multi-turn samples of `samples` (single-turn ones are skipped), each
    rendered with the tools its metadata names."""
    codecs: dict[str, ChatCodec] = {}
    out = []
    for s in samples:
        tools = s.metadata.get("tools") if isinstance(s.metadata, dict) else None
        key = repr(tools)
        codec = codecs.setdefault(key, ChatCodec(tokenizer, tools or None))
        audit = audit_sample(s, codec)
        if audit is not None:
            out.append(audit)
    return out


def check_turns(samples: list[Sample], tokenizer: object, *, rollout_id: int) -> int:
    """The in-run audit (`--ci-test`): every multi-turn sample of the rollout; returns how many.

    Raises:
        CheckFailure("turns", ...): the first error finding (sample, turn, cause, token and both ids).
    """
    audits = audit_samples(samples, tokenizer)
    for audit in audits:
        for f in audit.findings:
            if f.severity == "error":
                where = (
                    f" at response token {f.position}: recorded {f.recorded}, template {f.expected}"
                    if f.position >= 0
                    else ""
                )
                raise CheckFailure(
                    "turns",
                    f"rollout {rollout_id} sample {f.sample} turn {f.turn}: {f.cause}: {f.detail}{where} "
                    "(grpolab check turns on the recording shows every sample)",
                )
    return len(audits)
