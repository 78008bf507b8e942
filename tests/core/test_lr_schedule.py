"""The learning-rate schedule (core/lr_schedule.py): Megatron's `get_lr` values at the points that define
it, the flags that contradict, and which resumes it refuses."""

from __future__ import annotations

import math

import pytest

from grpolab.core.lr_schedule import LRSchedule, resume_mismatch


def test_warm_up_then_each_decay_style() -> None:
    cosine = LRSchedule(style="cosine", lr=1.0, min_lr=0.1, warmup_iters=4, decay_iters=14, warmup_init=0.2)
    assert [cosine.lr_at(s) for s in (0, 2, 4)] == pytest.approx(
        [0.2, 0.6, 1.0]
    )  # linear warm-up from --lr-warmup-init
    assert cosine.lr_at(9) == pytest.approx(0.1 + 0.5 * (math.cos(math.pi * 0.5) + 1) * 0.9)  # half-way: 0.55
    assert (
        cosine.lr_at(14) == pytest.approx(0.1) and cosine.lr_at(15) == 0.1
    )  # past --lr-decay-iters: --min-lr
    linear = LRSchedule(style="linear", lr=1.0, min_lr=0.0, warmup_iters=0, decay_iters=10)
    assert [linear.lr_at(s) for s in (0, 5, 10, 11)] == [1.0, 0.5, 0.0, 0.0]
    constant = LRSchedule(style="constant", lr=2e-4, warmup_iters=2, decay_iters=100)
    assert [constant.lr_at(s) for s in (0, 1, 2, 50, 1000)] == [0.0, 1e-4, 2e-4, 2e-4, 2e-4]
    assert cosine.describe(20).startswith(
        "lr schedule: cosine --lr 1, decays to --min-lr 0.1 at step 14; first step 0.2"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"style": "wsd"}, "--lr-decay-style must be one of constant, linear, cosine"),
        (
            {"warmup_iters": 10, "decay_iters": 5},
            "--lr-decay-iters 5 must be >= 1 and >= --lr-warmup-iters 10",
        ),
        ({"min_lr": 2.0}, "--min-lr must be in [0, --lr 1]"),
        ({"warmup_init": -1.0}, "--lr-warmup-init must be in [0, --lr 1]"),
        ({"warmup_iters": -1}, "--lr-warmup-iters must be >= 0"),
    ],
)
def test_schedule_flags_that_contradict(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        LRSchedule(**{"style": "linear", "lr": 1.0, "decay_iters": 10, **fields})


def test_which_resumes_are_refused() -> None:
    saved = LRSchedule(style="cosine", lr=1.0, warmup_iters=2, decay_iters=10)
    assert resume_mismatch(saved.as_dict(), saved.lr_at(5), saved, 5) is None
    longer = LRSchedule(style="cosine", lr=1.0, warmup_iters=2, decay_iters=20)
    why = resume_mismatch(saved.as_dict(), saved.lr_at(5), longer, 5)
    assert why is not None and "decay_iters 10 -> 20" in why and f"{saved.lr_at(5):.6g}" in why
    assert "this run's schedule gives" in why
    wrong_stamp = resume_mismatch(saved.as_dict(), 0.123, saved, 5)  # an edited trainer_state.json
    assert wrong_stamp is not None and "would train at lr 0.123" in wrong_stamp
    constant = LRSchedule(style="constant", lr=1.0, decay_iters=10)
    assert (
        resume_mismatch(constant.as_dict(), 1.0, LRSchedule(style="constant", lr=1.0, decay_iters=99), 3)
        is None
    )
    warm = LRSchedule(style="constant", lr=1.0, warmup_iters=4, decay_iters=10)
    assert (
        resume_mismatch(warm.as_dict(), 1.0, constant, 6) is None
    )  # both warm-ups over: the same lrs from here
    assert resume_mismatch(None, None, longer, 0) is None
    assert "is not a schedule" in resume_mismatch({"style": "cosine"}, None, longer, 0)


def test_a_schedule_with_the_same_next_lr_names_the_step_where_they_part() -> None:
    """Still in warm-up, cosine and linear give the same next lr: the refusal says so and names the
    first step whose lr differs (before, it printed two equal lrs as if they differed)."""
    saved = LRSchedule(style="cosine", lr=1.0, warmup_iters=4, decay_iters=8)
    other = LRSchedule(style="linear", lr=1.0, warmup_iters=4, decay_iters=8)
    why = resume_mismatch(saved.as_dict(), saved.lr_at(2), other, 2)
    assert why is not None and "style 'cosine' -> 'linear'" in why
    assert f"trains at lr {saved.lr_at(2):.6g} under both; they first differ at step 5" in why
    assert saved.lr_at(4) == other.lr_at(4) and saved.lr_at(5) != other.lr_at(5)
