"""Colocation: which side moves in which phase, under which flags, and under which perf timer."""

from __future__ import annotations

import pytest

from grpolab.core.config import ColocateConfig
from grpolab.core.metrics import PhaseTimer
from grpolab.train.colocation import Colocation


class Side:
    """Records engine and trainer moves in one shared list."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.offloaded = False

    def release_memory(self) -> None:
        self.calls.append("engine.release")

    def resume_memory(self) -> None:
        self.calls.append("engine.resume")

    def offload(self) -> None:
        self.calls.append("actor.offload")
        self.offloaded = True

    def onload(self) -> None:
        self.calls.append("actor.onload")
        self.offloaded = False


def run_two_steps(config: ColocateConfig, *, engine: bool = True, actor: bool = True):
    calls: list[str] = []
    timer = PhaseTimer()
    colocation = Colocation(
        config, engine=Side(calls) if engine else None, actor=Side(calls) if actor else None, timer=timer
    )
    for _ in range(2):
        colocation.after_rollout()
        colocation.before_train()
        colocation.before_sync()
    return calls, sorted(timer.pop())


def test_colocated_run_moves_both_sides_around_each_phase() -> None:
    calls, perf = run_two_steps(ColocateConfig(colocate=True, offload_train=True, offload_rollout=True))
    step = ["engine.release", "actor.offload", "engine.resume"]
    # the trainer starts on the device: it is brought back only after its first offload
    assert calls == step + ["engine.release", "actor.onload", "actor.offload", "engine.resume"]
    assert perf == [f"perf/{k}_time" for k in ("engine_release", "engine_resume", "sleep", "wake_up")]


@pytest.mark.parametrize(
    ("colocate", "offload_train", "offload_rollout", "expected"),
    [
        (False, True, True, []),
        (True, False, True, ["engine.release", "engine.resume"] * 2),
        (True, True, False, ["actor.offload", "actor.onload", "actor.offload"]),
        (True, False, False, []),
    ],
)
def test_flags_choose_what_moves(
    colocate: bool, offload_train: bool, offload_rollout: bool, expected: list[str]
) -> None:
    config = ColocateConfig(colocate=colocate, offload_train=offload_train, offload_rollout=offload_rollout)
    assert run_two_steps(config)[0] == expected


def test_a_missing_side_is_skipped() -> None:
    both = ColocateConfig(colocate=True, offload_train=True, offload_rollout=True)
    assert run_two_steps(both, engine=False)[0] == ["actor.offload", "actor.onload", "actor.offload"]
    assert run_two_steps(both, actor=False)[0] == ["engine.release", "engine.resume"] * 2
