"""Weight-version check (issue 15 item 17): every generated sample must come from the version the engine
acknowledged at the last sync. The rule on samples, the harness hook over ranks, and real runs: the
default run passes at every rollout, a lost weight sync (`skip_weight_sync` fault) fails the next one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runs import events

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.faults import FaultAction, FaultInjector, parse_fault_actions
from grpolab.checkers.harness import CheckHarness
from grpolab.checkers.weight_version import StaleSample, check_weight_versions, find_stale
from grpolab.cli import main
from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.rundir.writer import RunDirectory


def _sample(index: int, version: int, *, prompt_index: int = 7) -> Sample:
    return Sample(
        index=index,
        prompt_index=prompt_index,
        group_index=index // 2,
        sample_index=index % 2,
        seed=0,
        prompt_ids=[1],
        response_ids=[2],
        rollout_log_probs=torch.zeros(1),
        loss_mask=torch.ones(1),
        finish_reason="length",
        weight_version=version,
    )


def test_find_stale_lists_the_samples_of_another_version() -> None:
    samples = [_sample(0, 3), _sample(1, 3), _sample(2, 2, prompt_index=11), _sample(3, 4)]
    assert find_stale(samples, 3) == [
        StaleSample(index=2, prompt_index=11, sample_index=0, weight_version=2),
        StaleSample(index=3, prompt_index=7, sample_index=1, weight_version=4),
    ]
    assert find_stale(samples[:2], 3) == []
    check_weight_versions([], rollout_id=0, acknowledged=3, total=2)  # nothing stale: passes


def test_the_failure_names_the_sample_and_both_versions() -> None:
    stale = find_stale([_sample(0, 3), _sample(1, 3), _sample(2, 2, prompt_index=11)], 3)
    with pytest.raises(CheckFailure) as info:
        check_weight_versions(stale, rollout_id=5, acknowledged=3, total=3)
    assert info.value.checker == "weight_version"
    message = str(info.value)
    assert message.startswith("weight_version check failed: rollout 5: 1 of 3 samples were generated with ")
    assert (
        "first: rollout 5, prompt index 11, sample index 0 (rollout position 2) has weight_version 2 != 3"
        in message
    )


def test_the_harness_gathers_every_rank_and_records_verdicts(tmp_path: Path) -> None:
    harness = CheckHarness(Config(), RunDirectory(tmp_path))
    rank1 = [(2, [StaleSample(index=3, prompt_index=9, sample_index=1, weight_version=1)])]
    harness.after_generate(0, [_sample(0, 2), _sample(1, 2)], 2, lambda mine: mine)  # one rank, all fresh
    with pytest.raises(CheckFailure, match=r"1 of 4 samples .* prompt index 9, sample index 1 .* 1 != 2"):
        harness.after_generate(1, [_sample(0, 2), _sample(1, 2)], 2, lambda mine: mine + rank1)  # 2 ranks
    verdicts = [(e["checker"], e["ok"], e["rollout_id"]) for e in events(tmp_path, "check")]
    assert verdicts == [("weight_version", True, 0), ("weight_version", False, 1)]


def test_skip_weight_sync_fault_is_returned_at_its_point() -> None:
    actions = parse_fault_actions('[{"at_rollout": 1, "action": "skip_weight_sync"}]')
    assert (
        actions == [FaultAction(at_rollout=1, action="skip_weight_sync")]
        and actions[0].point == "weight_sync"
    )
    injector = FaultInjector(actions, rank=0)
    assert injector.maybe_fire("weight_sync", 0) == []
    assert injector.maybe_fire("end_of_rollout", 1) == []
    assert injector.maybe_fire("weight_sync", 1) == actions
    assert injector.maybe_fire("weight_sync", 1) == [] and injector.pending() == []  # fires once


_RUN = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8"]
_RUN += ["--no-progress"]


def test_default_run_passes_the_check_at_every_rollout(short_run: Path) -> None:
    checks = [e for e in events(short_run, "check") if e["checker"] == "weight_version"]
    assert [(c["rollout_id"], c["ok"], c["weight_version"]) for c in checks] == [(0, True, 1), (1, True, 2)]


def test_a_lost_weight_sync_fails_the_next_rollout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sync after rollout 0 never reaches the engine: it still generates with version 1 while the
    run counts version 2 as acknowledged, so rollout 1 fails naming the sample and both versions."""
    run_dir = tmp_path / "stale"
    fault = '[{"at_rollout": 0, "action": "skip_weight_sync"}]'
    code = main(
        ["train", *_RUN, "--num-rollout", "3", "--ci-ft-test-actions", fault, "--run-dir", str(run_dir)]
    )
    err = capsys.readouterr().err
    assert code == 1
    needle = "rollout 1: 4 of 4 samples were generated with weight version(s) [1], not version 2"
    assert needle in err and "first: rollout 1, prompt index " in err and "has weight_version 1 != 2" in err
    evs = events(run_dir)
    checks = [
        (e["rollout_id"], e["ok"]) for e in evs if e["event"] == "check" and e["checker"] == "weight_version"
    ]
    assert checks == [(0, True), (1, False)]
    assert [e["action"] for e in evs if e["event"] == "fault"] == ["skip_weight_sync"]
    assert evs[-1]["status"] == "failed" and needle in evs[-1]["error"]
