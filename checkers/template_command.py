"""`grpolab check template --hf-checkpoint M [--messages FILE]`: its parser, the report and the exit code.

The checks are `checkers/template_check.py`'s. Exit codes: 0 the rendering is append-only, 1 it is
not (the report names the conversation and the turn), 2 bad input (a model, tokenizer or messages
file that cannot be used, a tokenizer without a chat template, a flag value).
"""

from __future__ import annotations

import argparse
import math
import sys

PROG = "grpolab check template"


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    """Add `grpolab check` and its kinds (`template`, and `turns`: its command is
    rollout/turns_command.py, which reads recordings) to the `grpolab` subparsers (imports no torch)."""
    check = sub.add_parser(
        "check",
        help="check a model's setup before a run, a multi-turn recording, trainer/engine parity, or that a "
        "killed run resumes exactly (template, turns, parity, resume)",
    )
    kinds = check.add_subparsers(dest="check_kind", required=True, metavar="{template,turns,parity,resume}")
    t = kinds.add_parser(
        "template",
        help="is the chat template append-only across turns, and what it does to answer log-probs",
        description=(
            "Render each conversation prefix with the tokenizer's chat template and report whether the "
            "rendering is append-only across turns (exit 0) or at which turn it is not (exit 1), and the "
            "mean -log-prob per token of answers with and without the template (exit 2: bad input)."
        ),
    )
    t.add_argument("--hf-checkpoint", required=True, metavar="M", help="model directory or .gguf file")
    t.add_argument(
        "--messages",
        metavar="FILE",
        help='.jsonl conversations, one {"messages": [{"role": ..., "content": ...}, ...]} per line; '
        "given assistant turns are scored, a conversation without one gets the model's answer "
        "(default: built-in prompts from fixtures/data/arithmetic_test.jsonl)",
    )
    t.add_argument(
        "--answers",
        choices=("sampled", "greedy"),
        default="sampled",
        help="the model's answers: sampled at temperature 1 over the full vocabulary (as a default "
        "grpolab train rollout) or greedy (default: sampled)",
    )
    t.add_argument("--max-new-tokens", type=int, default=64, help="answer length limit (default: 64)")
    t.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    add_turns_parser(kinds)
    from grpolab.checkers.parity_command import add_parity_parser
    from grpolab.checkers.resume_command import add_resume_parser

    add_parity_parser(kinds)
    add_resume_parser(kinds)


def add_turns_parser(kinds: argparse._SubParsersAction) -> None:
    """Add `turns` to `grpolab check`'s kinds (imports no torch)."""
    t = kinds.add_parser(
        "turns",
        help="are a multi-turn recording's ids the chat template's between turns (the drift auditor)",
        description=(
            "Re-render each recorded multi-turn sample's messages with the chat template and compare the "
            "ids between the model's replies with the template's: exit 0 clean, 1 a turn boundary or "
            "mask invariant broken (naming the sample, the turn, the token and the cause), 2 bad input."
        ),
    )
    t.add_argument("recordings", nargs="+", metavar="RECORDING", help=".grz rollout recordings")
    t.add_argument(
        "--hf-checkpoint", metavar="M", help="model directory whose tokenizer and chat template to use "
        "(default: the recording run's --hf-checkpoint, from its run.json)",
    )  # fmt: skip
    t.add_argument("--json", action="store_true", help="print one JSON object instead of the report")


def run_check_command(args: argparse.Namespace) -> int:
    """Run `grpolab check <kind>`; return the exit code (see the module docstring)."""
    if args.max_new_tokens < 1:
        print(f"{PROG}: error: --max-new-tokens must be >= 1, got {args.max_new_tokens}", file=sys.stderr)
        return 2
    from grpolab.checkers import template_check as tc
    from grpolab.core.modeling import load_causal_lm, load_tokenizer, stop_token_ids

    try:
        given = tc.read_conversations(args.messages) if args.messages else None
        tokenizer = load_tokenizer(args.hf_checkpoint)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"--hf-checkpoint {args.hf_checkpoint}: the tokenizer has no chat template to check"
            )
        rendered = given or tc.builtin_conversations()
        breaks = [tc.first_break(tokenizer, c, i) for i, c in enumerate(rendered, 1)]
        scores = tc.score_conversations(
            load_causal_lm(args.hf_checkpoint),
            tokenizer,
            given or tc.builtin_prompts(),
            mode=args.answers,
            max_new_tokens=args.max_new_tokens,
            stop_ids=stop_token_ids(args.hf_checkpoint, tokenizer),
            seed=args.seed,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    found = [b for b in breaks if b is not None]
    print(
        f"{PROG}: {args.hf_checkpoint} (vocabulary {len(tokenizer)}: uniform noise is "
        f"ln({len(tokenizer)}) = {math.log(len(tokenizer)):.2f} nats per token)"
    )
    print(format_breaks(found, len(rendered), "--messages" if given else "built-in"))
    print(format_scores(scores, args, given is not None))
    return 1 if found else 0


def format_breaks(found: list, total: int, source: str) -> str:
    """The append-only verdict: yes over `total` conversations, or each `RenderBreak` with both texts."""
    if not found:
        return (
            f"append-only rendering: yes ({total} {source} conversation(s): at every turn k the rendering of "
            "turns 1..k, and before an assistant turn that of 1..k with the generation prompt, is a prefix "
            "of the rendering of turns 1..k+1)"
        )
    lines = [f"append-only rendering: NO ({len(found)} of {total} {source} conversation(s))"]
    for b in found:
        shorter = f"turns 1..{b.turn - 1}" + (
            " with the generation prompt" if b.with_generation_prompt else ""
        )
        lines += [
            f"  conversation {b.conversation}, turn {b.turn} ({b.role}): the rendering of {shorter} is not a "
            f"prefix of turns 1..{b.turn} (first difference at character {b.position}):",
            f"    {shorter}: …{b.shorter!r}",
            f"    turns 1..{b.turn}: …{b.longer!r}",
        ]
    lines.append(
        "  the template rewrites earlier turns (Qwen3-style templates drop the <think> content of earlier "
        "assistant turns): a multi-turn rollout's tokens are not those of the re-rendered conversation"
    )
    return "\n".join(lines)


def format_scores(scores: list, args: argparse.Namespace, given: bool) -> str:
    """The table of mean −log-prob per token with and without the template, and the token-weighted means."""
    if given:
        what = "given assistant turns (and the model's answers where a conversation has none)"
    else:
        what = "model's answers"
    how = "sampled at temperature 1, full vocabulary" if args.answers == "sampled" else "greedy"
    lines = [
        f"mean -log-prob per token (nats) of the {what}, {how}, seed {args.seed}, at most "
        f"{args.max_new_tokens} new tokens:",
        f"  {'#':>2}  {'context (last message)':<44} {'with template':>22} {'without template':>22}",
    ]

    def cell(nll: float, n: int) -> str:
        return f"{nll / n:.3f} ({n} tokens)" if n else "- (0 tokens)"

    for i, s in enumerate(scores, 1):
        label = s.label if len(s.label) <= 42 else s.label[:41] + "…"
        lines.append(
            f"  {i:>2}  {label!r:<44} {cell(s.with_nll, s.with_tokens):>22} {cell(s.without_nll, s.without_tokens):>22}"
        )
    w = (sum(s.with_nll for s in scores), sum(s.with_tokens for s in scores))
    o = (sum(s.without_nll for s in scores), sum(s.without_tokens for s in scores))
    lines.append(f"  {'':>2}  {'all (token-weighted)':<44} {cell(*w):>22} {cell(*o):>22}")
    return "\n".join(lines)
