"""What a model's chat template does to a run: `grpolab check template` (its command: template_command.py).

Two checks on a tokenizer's chat template (`tokenizer.apply_chat_template`, rendered as text):

- Append-only rendering. A multi-turn rollout feeds the model the rendering of turns 1..k and appends
  its answer; training re-renders the whole conversation. That is the same token stream only when
  rendering is append-only: for every k, the rendering of turns 1..k is a prefix of the rendering of
  turns 1..k+1, and, before an assistant turn, so is the rendering of turns 1..k with the
  generation prompt (what the model was actually given). Templates that rewrite earlier turns are
  not: Qwen3-style templates drop the `<think>` content of assistant turns before the last user
  message.
- Mean −log-prob per token (nats) of answers with and without the template: the model's own
  answers (sampled at temperature 1 over the full vocabulary, as a default `grpolab train` rollout
  samples, or greedy), or the assistant turns given in the conversations. An instruct model fed raw
  prompts answers with much higher −log-prob per token; uniform noise is ln(vocab size).
  Without the template a context is its messages' contents joined by newlines (a single user
  message is exactly the raw prompt `grpolab train` feeds without `--apply-chat-template`).

Legend: `T` context + answer length in tokens, `V` vocabulary size.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import DynamicCache

from grpolab.core.data import read_rows

Conversation = list[dict[str, str]]
AnswerMode = Literal["sampled", "greedy"]
ROLES = ("system", "user", "assistant", "tool")
FIXTURE_PROMPTS = Path(__file__).resolve().parent.parent / "fixtures" / "data" / "arithmetic_test.jsonl"
"""The built-in prompts: the first rows of the tiny model's arithmetic test set."""
NUM_BUILTIN_PROMPTS = 4
SNIPPET = 60
"""Characters shown on each side of the first difference of two renderings."""


@dataclass(frozen=True, kw_only=True)
class RenderBreak:
    """Where rendering stops being append-only.

    Attributes:
        conversation: 1-based index of the conversation in its file (or the built-in set).
        turn: 1-based index of the turn whose addition changes earlier text (k + 1).
        role: that turn's role.
        with_generation_prompt: the shorter rendering had the generation prompt (before an assistant turn).
        position: index of the first character where the two renderings differ.
        shorter / longer: the text around `position` in each rendering.
    """

    conversation: int
    turn: int
    role: str
    with_generation_prompt: bool
    position: int
    shorter: str
    longer: str


@dataclass(frozen=True, kw_only=True)
class AnswerScore:
    """Mean −log-prob per token of one context's answer, with and without the chat template.

    Attributes:
        label: a short text naming the context (its last message, cut).
        with_nll / without_nll: summed −log-prob (nats) of the answer tokens in each setting.
        with_tokens / without_tokens: the number of answer tokens in each setting.
    """

    label: str
    with_nll: float
    with_tokens: int
    without_nll: float
    without_tokens: int


def read_conversations(path: str | Path) -> list[Conversation]:
    """Conversations from a .jsonl (or .parquet) file: one per row, an object whose "messages" is a
    list of {"role": system/user/assistant/tool, "content": text} (the OpenAI chat format).

    Raises:
        ValueError / FileNotFoundError: naming `--messages`, the file and the row (`core.data.read_rows`
            checks the file, its encoding and its JSON).
    """
    rows = read_rows(path, flag="--messages")
    if not rows:
        raise ValueError(f"--messages: {path} holds no conversation")
    return [_conversation(row, f"{path} row {i}") for i, row in enumerate(rows, 1)]


def _conversation(row: dict[str, Any], where: str) -> Conversation:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f'--messages: {where}: expected {{"messages": [...]}} with at least one message')
    for i, m in enumerate(messages, 1):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise ValueError(
                f'--messages: {where}, message {i}: expected {{"role": one of {"/".join(ROLES)}, '
                f'"content": text}}, got {json.dumps(m)[:80]}'
            )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def builtin_conversations() -> list[Conversation]:
    """One two-exchange conversation from the first fixture rows, its answers in `<think>` form
    (so a template that drops earlier reasoning shows), for the append-only check."""
    rows = read_rows(FIXTURE_PROMPTS)[:2]
    conversation: Conversation = []
    for row in rows:
        work, _, result = str(row["answer"]).partition("####")
        conversation.append({"role": "user", "content": str(row["question"])})
        answer = f"<think>\n{work.strip()}\n</think>\n\n#### {result.strip()}"
        conversation.append({"role": "assistant", "content": answer})
    return [conversation]


def builtin_prompts() -> list[Conversation]:
    """Single-user-message conversations of the first NUM_BUILTIN_PROMPTS fixture questions."""
    rows = read_rows(FIXTURE_PROMPTS)[:NUM_BUILTIN_PROMPTS]
    return [[{"role": "user", "content": str(r["question"])}] for r in rows]


def render(tokenizer: Any, messages: Conversation, *, generation_prompt: bool = False) -> str:
    """The chat template's text for `messages` (no tokenization).

    Raises:
        ValueError: the template refuses these messages (its message).
    """
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as e:  # jinja2 TemplateError / raise_exception in the template, any subclass
        raise ValueError(f"the chat template refuses turns 1..{len(messages)}: {e}") from None


def first_break(tokenizer: Any, conversation: Conversation, index: int) -> RenderBreak | None:
    """The first turn at which rendering `conversation` stops being append-only, or None.

    Prefixes the template refuses on their own (e.g. a system message alone) are skipped.

    Raises:
        ValueError: the template refuses the whole conversation.
    """
    full = render(tokenizer, conversation)
    for k in range(1, len(conversation)):
        nxt = full if k + 1 == len(conversation) else render(tokenizer, conversation[: k + 1])
        shorter_kinds = [False] + ([True] if conversation[k]["role"] == "assistant" else [])
        for gen in shorter_kinds:
            try:
                shorter = render(tokenizer, conversation[:k], generation_prompt=gen)
            except ValueError:
                continue
            if not nxt.startswith(shorter):
                pos = next((i for i, (a, b) in enumerate(zip(shorter, nxt)) if a != b), len(shorter))
                cut = slice(max(0, pos - SNIPPET), pos + SNIPPET)
                return RenderBreak(
                    conversation=index,
                    turn=k + 1,
                    role=conversation[k]["role"],
                    with_generation_prompt=gen,
                    position=pos,
                    shorter=shorter[cut],
                    longer=nxt[cut],
                )
    return None


def plain_context(messages: Conversation) -> str:
    """A context without the template: the contents joined by newlines (one user message: itself)."""
    return "\n".join(m["content"] for m in messages)


def answer_nll(model: torch.nn.Module, context_ids: list[int], answer_ids: list[int]) -> float:
    """Summed −log p(answer | context) in nats, scored in one float32 forward over the full vocabulary.

    Raises:
        ValueError: an empty context (nothing predicts the first answer token).
    """
    if not context_ids:
        raise ValueError("an empty context cannot be scored")
    if not answer_ids:
        return 0.0
    ids_1T = torch.tensor([context_ids + answer_ids])
    with torch.no_grad():
        logits_TV = model(input_ids=ids_1T).logits[0].float()
    logp_TV = torch.log_softmax(logits_TV[len(context_ids) - 1 : -1], dim=-1)
    return -float(logp_TV.gather(1, torch.tensor(answer_ids)[:, None]).sum())


def generate(
    model: torch.nn.Module,
    context_ids: list[int],
    *,
    mode: AnswerMode,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    generator: torch.Generator,
) -> list[int]:
    """The model's answer token ids: greedy, or sampled at temperature 1 over the full vocabulary;
    it ends at the first stop token (kept) or after `max_new_tokens`."""
    out: list[int] = []
    ids_1T = torch.tensor([context_ids])
    # transformers 5.x renamed `past_key_values` to `cache` (as core/engine/torch_engine.py)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = {cache_kw: DynamicCache()}
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits_V = model(input_ids=ids_1T, use_cache=True, **cache).logits[0, -1].float()
            if mode == "greedy":
                token = int(logits_V.argmax())
            else:
                token = int(torch.multinomial(torch.softmax(logits_V, dim=-1), 1, generator=generator))
            out.append(token)
            if token in stop_ids:
                break
            ids_1T = torch.tensor([[token]])
    return out


def score_conversations(
    model: torch.nn.Module,
    tokenizer: Any,
    conversations: list[Conversation],
    *,
    mode: AnswerMode,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    seed: int,
) -> list[AnswerScore]:
    """One `AnswerScore` per given assistant turn (its context: the turns before it), and per
    conversation without an assistant turn one for the model's own answer to it (`mode`).

    Raises:
        ValueError: the template refuses a context, or a context is empty.
    """
    generator = torch.Generator().manual_seed(seed)
    scores = []
    for conversation in conversations:
        turns = [j for j, m in enumerate(conversation) if m["role"] == "assistant" and j > 0]
        targets = [(conversation[:j], conversation[j]["content"]) for j in turns] or [(conversation, None)]
        for context, given in targets:
            settings = []
            for text in (render(tokenizer, context, generation_prompt=True), plain_context(context)):
                ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
                answer = (
                    list(tokenizer(given, add_special_tokens=False)["input_ids"])
                    if given is not None
                    else generate(
                        model,
                        ids,
                        mode=mode,
                        max_new_tokens=max_new_tokens,
                        stop_ids=stop_ids,
                        generator=generator,
                    )
                )
                settings.append((answer_nll(model, ids, answer), len(answer)))
            (w_nll, w_n), (o_nll, o_n) = settings
            label = " ".join(context[-1]["content"].split())
            scores.append(
                AnswerScore(
                    label=label, with_nll=w_nll, with_tokens=w_n, without_nll=o_nll, without_tokens=o_n
                )
            )
    return scores
