"""`--true-on-policy-mode`: the trainer-vs-engine gap is exactly 0.0 on every step, and --ci-test fails
a run whose engine does not re-score its answers, naming the first sample and token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runs import SMALL, metrics, run

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.true_on_policy import first_mismatch
from grpolab.cli import main
from grpolab.core.batch import Sample
from grpolab.core.engine.base import GenerationRequest, SamplingParams
from grpolab.core.engine.torch_engine import TorchEngine

GAP = "train/train_rollout_logprob_abs_diff"
TINY_MODEL = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-qwen3"


def gaps(run_dir: Path) -> list[float]:
    return [m[GAP] for m in metrics(run_dir, "step")]


def test_default_run_gap_is_exactly_zero_and_nonzero_without_the_mode(tmp_path: Path) -> None:
    off = gaps(run(tmp_path, "off", "--num-rollout", "2"))
    on_dir = run(tmp_path, "on", "--num-rollout", "2", "--true-on-policy-mode", "--ci-test")
    on = gaps(on_dir)
    assert len(on) == 2 and on == [0.0, 0.0]
    assert all(g > 0.0 for g in off)  # the mode is what makes it 0: the decode's numbers differ
    # the same samples either way: the mode changes the numbers logged, not what is sampled
    assert [m["rollout/response_lengths"] for m in metrics(on_dir, "rollout")] == [
        m["rollout/response_lengths"] for m in metrics(tmp_path / "off", "rollout")
    ]


def test_top_p_top_k_and_bfloat16_give_zero(tmp_path: Path) -> None:
    flags = ["--num-rollout", "2", "--true-on-policy-mode", "--ci-test", "--rollout-top-p", "0.9"]
    flags += ["--rollout-top-k", "20", "--rollout-dtype", "bfloat16", "--train-dtype", "bfloat16"]
    assert gaps(run(tmp_path, "bf16", *flags)) == [0.0, 0.0]


def test_two_ranks_give_zero(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "grpolab", "train", "--nproc-per-node", "2", *SMALL, "--num-rollout", "2"]
    argv += ["--true-on-policy-mode", "--ci-test", "--run-dir", str(tmp_path / "two")]
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert gaps(tmp_path / "two") == [0.0, 0.0]


def test_ci_test_fails_an_engine_that_does_not_rescore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planted fault: the engine keeps its decode log-probs (a server without the mode)."""
    monkeypatch.setattr(TorchEngine, "_rescore_by_prefill", lambda self, *a: None)
    with pytest.raises(CheckFailure) as error:
        run(tmp_path, "planted", "--num-rollout", "1", "--true-on-policy-mode", "--ci-test")
    text = str(error.value)
    assert "true_on_policy check failed: rollout 0" in text
    assert "the first is sample 0, answer token" in text and "trained tokens differ" in text


def test_the_engine_rescored_log_probs_do_not_depend_on_the_batch() -> None:
    """A request alone and among 7 companions: decode log-probs may differ, re-scored ones never."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, top_k=20, stop_token_ids=())
    me = GenerationRequest(prompt_ids=[5, 6, 7, 8], seed=3)
    others = [GenerationRequest(prompt_ids=list(range(10, 10 + n)), seed=n) for n in range(3, 10)]
    for rescored in (False, True):
        engine = TorchEngine(TINY_MODEL, show_progress=False, true_on_policy=rescored)
        alone = engine.generate([me], params)[0]
        batch = engine.generate([*others[:3], me, *others[3:]], params)
        assert batch[3].response_ids == alone.response_ids
        # the decode's numbers depend on the batch (so this test can fail); the prefill's do not
        assert torch.equal(batch[3].log_probs, alone.log_probs) == rescored


def test_first_mismatch_names_the_sample_and_token_and_ignores_untrained_tokens() -> None:
    def sample(i: int, engine: list[float], mask: list[float]) -> Sample:
        return Sample(index=i, prompt_index=0, group_index=0, sample_index=i, seed=i, prompt_ids=[1],
                      response_ids=[7, 8, 9], rollout_log_probs=torch.tensor(engine),
                      loss_mask=torch.tensor(mask), finish_reason="stop")  # fmt: skip

    trainer = [torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.0, -2.0, -3.0])]
    same = [sample(0, [-1.0, -2.0, -3.0], [1, 1, 1]), sample(1, [-1.0, -2.5, -3.0], [1, 0, 1])]
    assert first_mismatch(same, trainer) is None  # the differing token is a tool token (mask 0)
    off = [sample(0, [-1.0, -2.0, -3.0], [1, 1, 1]), sample(1, [-1.0, -2.0, -3.0 + 1e-6], [1, 1, 1])]
    m = first_mismatch(off, trainer)
    assert m is not None and (m.sample, m.token, m.token_id, m.differing, m.total) == (1, 2, 9, 1, 6)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--rollout-dtype", "bfloat16"],
            "--true-on-policy-mode needs --rollout-dtype equal to --train-dtype",
        ),
        (["--train-forward", "shared-prefix"], "--train-forward shared-prefix packs samples"),
    ],
)
def test_refused_combinations_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, flags, message) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--true-on-policy-mode", *flags, "--run-dir", str(tmp_path / "r")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
