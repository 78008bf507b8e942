"""Groups that cannot have an advantage: a shared seed fails --ci-test naming the group and samples;
identical answers are a note, and fail only when every group of the rollout has them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runs import events, train_short

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.group_seeds import check_groups, group_findings
from grpolab.core.batch import Sample


def sample(i: int, group: int, seed: int, response: list[int]) -> Sample:
    return Sample(index=i, prompt_index=group, group_index=group, sample_index=i, seed=seed, prompt_ids=[1],
                  response_ids=response, rollout_log_probs=torch.zeros(len(response)),
                  loss_mask=torch.ones(len(response)), finish_reason="stop")  # fmt: skip


def test_findings_and_verdicts() -> None:
    healthy = [
        sample(0, 0, 10, [5, 6]),
        sample(1, 0, 11, [5, 7]),
        sample(2, 1, 12, [8]),
        sample(3, 1, 13, [8]),
    ]
    findings = group_findings(healthy)
    assert [(f.code, f.group, f.samples) for f in findings] == [("identical_responses", 1, (2, 3))]
    check_groups(0, healthy, findings)  # one confident group is not a failure
    collapsed = [sample(0, 0, 10, [5]), sample(1, 0, 11, [5]), sample(2, 1, 12, [8]), sample(3, 1, 13, [8])]
    with pytest.raises(CheckFailure, match="in every one of its 2 groups all answers are identical"):
        check_groups(0, collapsed, group_findings(collapsed))
    shared = [
        sample(0, 0, 10, [5, 6]),
        sample(1, 0, 10, [5, 7]),
        sample(2, 1, 12, [8]),
        sample(3, 1, 13, [9]),
    ]
    with pytest.raises(CheckFailure, match=r"group 0: samples \[0, 1\] share sampling seed 10"):
        check_groups(3, shared, group_findings(shared))


def test_a_run_whose_samples_share_a_seed_fails_under_ci_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planted fault: every sample of a group seeded like its first (UniRL PR #208)."""
    import grpolab.rollout.sample_plan as plan

    real = plan.derive_sample_seed
    monkeypatch.setattr(
        plan, "derive_sample_seed", lambda seed, rollout, prompt, k: real(seed, rollout, prompt, 0)
    )
    with pytest.raises(CheckFailure, match="group_seeds check failed: rollout 0: group 0: samples"):
        train_short(tmp_path / "shared", "--ci-test")
    assert events(tmp_path / "shared", "group_seeds")[0]["code"] == "shared_seed"


def test_a_healthy_ci_run_passes_the_check(tmp_path: Path) -> None:
    run = train_short(tmp_path / "ok", "--ci-test")
    verdicts = [e for e in events(run, "check") if e.get("checker") == "group_seeds"]
    assert len(verdicts) == 2 and all(v["ok"] for v in verdicts)
