"""The log-prob checker's messages (issue 15 items 15 and 16): crafted inputs that make each check
fail, and what the message says first. Pure: no model, no run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from runs import SMALL, events

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.logprobs import ENTROPY_RANGE, LogprobChecker, RunFacts, check_logprobs
from grpolab.cli import build_parser, config_from_args, main
from grpolab.core.config import CIConfig
from grpolab.train.loop import GRPORun

ARITHMETIC = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "arithmetic_train.jsonl"
SMOL_VOCAB = 49152  # SmolLM2's vocabulary: uniform noise is ln(49152) = 10.80 nats
LINE = {"rollout/log_probs": -0.5, "rollout/rollout_log_probs": -0.5, "rollout/ref_log_probs": -0.5}


def _fail(**kw) -> str:
    with pytest.raises(CheckFailure) as info:
        check_logprobs(**kw)
    return str(info.value)


def _causes(message: str) -> list[str]:
    """The cause lines of a message, in order, without their '  - ' bullet."""
    return [line[4:] for line in message.splitlines() if line.startswith("  - ")]


def _entropy_kw(entropy: float, facts: RunFacts, entropy_range=ENTROPY_RANGE) -> dict:
    e = [torch.tensor([-0.5, -0.5])]
    return dict(
        rollout_id=0,
        rollout_line={**LINE, "rollout/entropy": entropy},
        trainer=e,
        reference=None,
        engine=e,
        response_ids=[[3, 4]],
        entropy_range=entropy_range,
        facts=facts,
    )


def test_raw_prompts_entropy_is_not_called_noise_and_names_the_template_first() -> None:
    # the case: SmolLM2-Instruct on raw GSM8K questions, entropy 2.19 nats
    facts = RunFacts(vocab_size=SMOL_VOCAB, chat_template_unapplied=True)
    text = _fail(**_entropy_kw(2.19, facts))
    assert "rollout/entropy 2.1900 outside (0.0, 0.7)" in text
    assert "close to uniform noise" not in text
    assert "unsure, not random: uniform noise would be ln(49152) = 10.80 nats (20% of it)" in text
    assert _causes(text)[0].startswith("the chat template is not applied")
    # with the template applied the template is no suspect, and the range flag is the first advice
    text = _fail(**_entropy_kw(2.19, RunFacts(vocab_size=SMOL_VOCAB)))
    assert "chat template" not in text and "widen --ci-entropy-range" in _causes(text)[0]


def test_uniform_noise_is_said_only_near_ln_vocab() -> None:
    facts = RunFacts(vocab_size=SMOL_VOCAB)
    near = 0.9 * math.log(SMOL_VOCAB)
    assert "close to uniform noise (ln(49152) = 10.80 nats)" in _fail(**_entropy_kw(near + 1e-6, facts))
    assert "close to uniform noise" not in _fail(**_entropy_kw(near - 1e-3, facts))
    assert "close to uniform noise" not in _fail(**_entropy_kw(5.0, RunFacts()))  # vocab unknown
    assert "collapsed to deterministic outputs" in _fail(**_entropy_kw(0.0, facts))


def test_entropy_range_is_a_flag_with_miles_default() -> None:
    facts = RunFacts(vocab_size=SMOL_VOCAB)
    check_logprobs(**_entropy_kw(2.19, facts, entropy_range=(0.0, 3.0)))  # inside the given range
    assert "outside (0.0, 3.0)" in _fail(**_entropy_kw(3.5, facts, entropy_range=(0.0, 3.0)))
    assert CIConfig().ci_entropy_range == list(ENTROPY_RANGE) == [0.0, 0.7]
    args = build_parser().parse_args(["train", "--ci-entropy-range", "0.1", "3"])
    assert config_from_args(args).ci.ci_entropy_range == [0.1, 3.0]
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "Miles' --ci-test" in help_text and "ln(vocab size)" in help_text


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        (["0.5"], "argument --ci-entropy-range: expected 2 arguments"),  # argparse: the flag takes exactly 2
        (["0", "1", "2"], "unrecognized arguments: 2"),
        (["1", "0.5"], "--ci-entropy-range takes two values LOW HIGH"),
        (["-1", "1"], "--ci-entropy-range takes two values LOW HIGH"),
    ],
)
def test_bad_entropy_range_is_bad_input(values: list[str], needle: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--ci-entropy-range", *values])
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


def _gap_inputs(trainer_shift: torch.Tensor) -> dict:
    # multiples of 1/8: adding a power-of-two shift is exact in float32
    engine = [torch.tensor([-0.25, -0.5, -0.75, -0.875]), torch.tensor([-0.125, -0.375, -0.625, -1.0])]
    trainer = [e + s for e, s in zip(engine, trainer_shift)]
    return dict(trainer=trainer, reference=None, engine=engine, response_ids=[[5, 6, 7, 8], [9, 10, 11, 12]])


def _line(kw: dict) -> dict:
    lp = float(torch.cat(kw["trainer"]).mean())
    return {
        **LINE,
        "rollout/log_probs": lp,
        "rollout/rollout_log_probs": float(torch.cat(kw["engine"]).mean()),
    }


def test_gap_that_jumps_after_a_sync_names_stale_weights_first() -> None:
    checker = LogprobChecker(abs_tol=0.03, entropy_range=ENTROPY_RANGE, facts=RunFacts())
    tiny = 2.0**-20  # 9.537e-07
    small = _gap_inputs(torch.tensor([[tiny, -tiny, tiny, -tiny], [tiny, -tiny, tiny, -tiny]]))
    checker.check(0, _line(small), **small)  # rollout 0: same weights on both sides, passes
    assert checker.first_gap is not None and checker.first_gap.gap == tiny
    # rollout 1: mixed-sign per-token gaps, mean gap 0.05 > 0.03 (old weights on the engine)
    jumped = _gap_inputs(torch.tensor([[0.2, -0.05, 0.2, -0.05], [0.2, -0.05, 0.1, -0.15]]))
    with pytest.raises(CheckFailure) as info:
        checker.check(1, _line(jumped), **jumped)
    text = str(info.value)
    first = _causes(text)[0]
    assert first.startswith("stale engine weights: the mean per-token gap was 9.537e-07 at rollout 0")
    assert "is 1.250e-01 now, after 1 weight sync(s): the sync did not reach the engine" in first
    assert "mixed signs" in text
    # a fresh checker at rollout 1 has no small first gap to compare: stale weights is listed last
    fresh = LogprobChecker(abs_tol=0.03, entropy_range=ENTROPY_RANGE, facts=RunFacts())
    with pytest.raises(CheckFailure) as info:
        fresh.check(1, _line(jumped), **jumped)
    causes = _causes(str(info.value))
    assert causes[0].startswith("temperature applied on one side only")
    assert causes[-1].startswith("stale engine weights: a weight sync that did not reach the engine")


def test_a_gap_close_to_the_first_is_not_a_jump() -> None:
    checker = LogprobChecker(abs_tol=0.03, entropy_range=ENTROPY_RANGE, facts=RunFacts())
    near = _gap_inputs(torch.full((2, 4), 0.025))
    checker.check(0, _line(near), **near)
    over = _gap_inputs(torch.full((2, 4), 0.035))  # 1.4x the first gap: drift, not a jump
    with pytest.raises(CheckFailure) as info:
        checker.check(1, _line(over), **over)
    assert not _causes(str(info.value))[0].startswith("stale engine weights:")


def _support_case(full_side: str) -> tuple[dict, list[list[torch.Tensor]]]:
    """Per-token log-probs where one side scores over the kept set and the other over the full vocab.

    Each position's kept set and kept mass M: the kept side is log p − log M, the full side log p.
    """
    log_p = [[-0.2, -0.05, -0.9, -0.3], [-0.1, -0.6, -0.02, -0.4]]
    kept_sizes = [[1, 1, 3, 1], [1, 2, 1, 1]]
    log_mass = [[-0.2, -0.05, -0.1, -0.3], [-0.1, -0.2, -0.02, -0.4]]  # = log p where one token is kept
    full = [torch.tensor(row) for row in log_p]
    kept = [torch.tensor(p) - torch.tensor(m) for p, m in zip(log_p, log_mass)]
    ids = [[torch.arange(n) for n in row] for row in kept_sizes]
    trainer, engine = (full, kept) if full_side == "trainer" else (kept, full)
    kw = dict(trainer=trainer, reference=None, engine=engine, response_ids=[[5, 6, 7, 8], [9, 10, 11, 12]])
    return kw, ids


@pytest.mark.parametrize("full_side, kept_side", [("trainer", "engine"), ("engine", "trainer")])
def test_gaps_equal_to_log_kept_mass_say_the_support_differs(full_side: str, kept_side: str) -> None:
    kw, ids = _support_case(full_side)
    facts = RunFacts(filters_support=True, chat_template_unapplied=True)
    text = _fail(rollout_id=1, rollout_line=_line(kw), **kw, facts=facts, kept_token_ids=ids)
    first = _causes(text)[0]
    assert first.startswith(
        f"the supports differ: the {full_side} scores over the full vocabulary and the {kept_side} over the kept set"
    )
    assert "At the 6 of 6 positions where the sampler kept a single token" in first
    assert "2 of 2 other differing tokens have its sign" in first
    assert _causes(text)[1].startswith("the chat template is not applied")  # evidence before settings
    # top-p/top-k off: nothing was kept, the support is no suspect beyond the usual list
    text = _fail(rollout_id=1, rollout_line=_line(kw), **kw, facts=RunFacts(), kept_token_ids=None)
    assert not any(c.startswith("the supports differ") for c in _causes(text))


def test_gaps_that_do_not_match_the_kept_mass_are_not_called_a_support_mismatch() -> None:
    kw, ids = _support_case("trainer")
    kw["engine"] = [e - 0.1 for e in kw["engine"]]  # the kept side no longer reads log 1 = 0
    text = _fail(
        rollout_id=1, rollout_line=_line(kw), **kw, facts=RunFacts(filters_support=True), kept_token_ids=ids
    )
    assert not any(c.startswith("the supports differ") for c in _causes(text))
    assert any(c.startswith("scoring over a different support") for c in _causes(text))  # still listed


def test_template_is_the_first_suspect_of_a_gap_without_evidence() -> None:
    kw = _gap_inputs(torch.full((2, 4), -0.05))
    text = _fail(rollout_id=0, rollout_line=_line(kw), **kw, facts=RunFacts(chat_template_unapplied=True))
    causes = _causes(text)
    assert causes[0].startswith("the chat template is not applied")
    assert causes[1].startswith("temperature applied on one side only")


def test_a_run_whose_syncs_never_reach_the_engine_names_stale_weights_first(tmp_path: Path, capsys) -> None:
    """A real run whose weight syncs never reach the engine (`--debug-skip-weight-update`): rollout 0
    passes with both sides on the initial weights; after one update the gap jumps, stale weights first."""
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout", "2", "--lr", "1e-3", "--ci-test", "--ci-disable-weight-update-checker",
            "--debug-skip-weight-update", "--run-dir", str(tmp_path / "stale"),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    first = _causes(err)[0]
    assert first.startswith(
        "stale engine weights (this run has --debug-skip-weight-update: no weights are sent)"
    )
    assert "at rollout 0 (trainer and engine on the same weights)" in first
    assert "after 1 weight sync(s): the sync did not reach the engine" in first
    checks = [
        (c["rollout_id"], c["ok"]) for c in events(tmp_path / "stale", "check") if c["checker"] == "logprobs"
    ]
    assert checks == [(0, True), (1, False)]
    assert "chat template" not in first and not events(tmp_path / "stale", "warning")  # template applied


def test_raw_prompts_with_a_chat_template_warn_at_start_and_tell_the_checker(tmp_path: Path, caplog) -> None:
    argv = [
        "train",
        *SMALL,
        "--prompt-data",
        str(ARITHMETIC),
        "--input-key",
        "question",
        "--label-key",
        "answer",
    ]
    argv += ["--ci-test", "--rollout-top-p", "0.9", "--run-dir", str(tmp_path / "raw")]
    run = GRPORun.create(config_from_args(build_parser().parse_args(argv)), ["grpolab", *argv])
    facts = run.harness.logprobs.facts
    assert facts == RunFacts(vocab_size=1024, chat_template_unapplied=True, filters_support=True)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("has a chat template, but --apply-chat-template is off" in m for m in warned)
    assert [w["code"] for w in events(tmp_path / "raw", "warning")] == ["chat_template_unapplied"]
