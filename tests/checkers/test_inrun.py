"""In-run checkers wired into real runs on the tiny model: they pass on healthy runs and fail where it breaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from runs import SMALL, events, run

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.kl import check_kl
from grpolab.checkers.logprobs import check_logprobs
from grpolab.cli import main
from grpolab.core.actor import Actor


def test_healthy_ci_run_passes_every_checker(tmp_path: Path) -> None:
    arith = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "arithmetic_test.jsonl"
    out = run(
        tmp_path,
        "ok",
        "--num-rollout",
        "2",
        "--ci-test",
        "--eval-interval",
        "1",
        "--eval-prompt-data",
        "arith",
        str(arith),
        "--eval-max-prompts",
        "16",
        "--ci-metric-checker-key",
        "eval/arith",
        "--ci-metric-checker-threshold",
        "0.05",
    )
    checks = events(out, "check")
    assert {c["checker"] for c in checks} == {
        "weight_update",
        "weight_version",
        "logprobs",
        "kl",
        "metric",
        "group_seeds",
    }
    assert all(c["ok"] for c in checks)
    assert [c["rollout_id"] for c in checks if c["checker"] == "kl"] == [0, 1]
    assert events(out)[-1]["status"] == "finished"


def test_kl_checker_thresholds() -> None:
    check_kl(
        {"train/ppo_kl": 0.0, "train/pg_clipfrac": 0.0, "train/kl_loss": 0.0},
        rollout_id=0,
        step_in_rollout=0,
        first_step_of_run=True,
    )
    check_kl(
        {"train/ppo_kl": 0.5}, rollout_id=0, step_in_rollout=1, first_step_of_run=False
    )  # later steps are free
    with pytest.raises(CheckFailure, match=r"train/ppo_kl = 2e-09 at rollout 3"):
        check_kl(
            {"train/ppo_kl": 2e-9, "train/step": 3}, rollout_id=3, step_in_rollout=0, first_step_of_run=False
        )
    with pytest.raises(CheckFailure, match="pg_clipfrac"):
        check_kl(
            {"train/ppo_kl": 0.0, "train/pg_clipfrac": 1e-9},
            rollout_id=0,
            step_in_rollout=0,
            first_step_of_run=False,
        )
    with pytest.raises(CheckFailure, match="kl_loss"):
        check_kl(
            {"train/ppo_kl": 0.0, "train/kl_loss": 1e-6},
            rollout_id=0,
            step_in_rollout=0,
            first_step_of_run=True,
        )


def test_logprob_checker_names_tokens_and_calls_a_bias() -> None:
    engine = [torch.tensor([-0.1, -0.2, -0.3]), torch.tensor([-1.0, -0.5])]
    trainer = [t - 0.05 for t in engine]
    trainer[1][0] = -1.4  # the worst token
    line = {
        "rollout/log_probs": -0.5,
        "rollout/rollout_log_probs": -0.4,
        "rollout/ref_log_probs": -0.5,
        "rollout/entropy": 0.3,
    }
    with pytest.raises(CheckFailure) as info:
        check_logprobs(
            1,
            line,
            trainer=trainer,
            reference=None,
            engine=engine,
            response_ids=[[5, 6, 7], [8, 9]],
            abs_tol=0.03,
        )
    text = str(info.value)
    assert "sample 1, position 0, token 8: -1.400000 vs -1.000000" in text
    assert "100.0% of the 5 differing tokens have one sign (trainer below engine): a bias" in text
    assert "temperature applied on one side only" in text
    mixed = [engine[0] + torch.tensor([0.05, -0.05, 0.05]), engine[1] + torch.tensor([-0.05, 0.05])]
    with pytest.raises(CheckFailure, match="mixed signs"):
        check_logprobs(
            1,
            line,
            trainer=mixed,
            reference=None,
            engine=engine,
            response_ids=[[5, 6, 7], [8, 9]],
            abs_tol=0.03,
        )
    check_logprobs(
        1,
        {**line, "rollout/log_probs": -0.41},
        trainer=trainer,
        reference=None,
        engine=engine,
        response_ids=[[5, 6, 7], [8, 9]],
    )
    with pytest.raises(CheckFailure, match=r"rollout/entropy 0.9000 outside"):
        check_logprobs(
            1,
            {**line, "rollout/log_probs": -0.41, "rollout/entropy": 0.9},
            trainer=trainer,
            reference=None,
            engine=engine,
            response_ids=[[5, 6, 7], [8, 9]],
        )


def test_temperature_on_one_side_fails_the_run_with_a_bias_diagnosis(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    original = Actor.__init__

    def trainer_ignores_temperature(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.temperature = 1.0  # the classic bug: engine samples at 0.5, trainer scores at 1.0

    monkeypatch.setattr(Actor, "__init__", trainer_ignores_temperature)
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout",
            "1",
            "--ci-test",
            "--rollout-temperature",
            "0.5",
            "--ci-logprobs-checker-abs-tol",
            "0.01",
            "--run-dir",
            str(tmp_path / "t"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "trainer-vs-engine gap" in err
        and "a bias, not noise" in err
        and "temperature applied on one side only" in err
    )


def test_weight_update_checker_names_the_tensor_the_sync_missed(tmp_path: Path, monkeypatch, capsys) -> None:
    original = Actor.named_weights

    def forgets_one(self):
        return ((n, t) for n, t in original(self) if n != "model.layers.1.mlp.up_proj.weight")

    monkeypatch.setattr(Actor, "named_weights", forgets_one)
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout",
            "1",
            "--check-weight-update-equal",
            "--run-dir",
            str(tmp_path / "w"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "1 engine tensor(s) not overwritten" in err
        and "model.layers.1.mlp.up_proj.weight: shape (384, 128)" in err
    )


def test_grad_norm_save_then_bitwise_load_on_replay(tmp_path: Path, capsys) -> None:
    rec = str(tmp_path / "rec" / "r_{rollout_id}.grz")
    norms = str(tmp_path / "gn" / "{role}_{rollout_id}_{step_id}.json")
    run(tmp_path, "a", "--num-rollout", "2", "--save-debug-rollout-data", rec, "--ci-save-grad-norm", norms)
    assert sorted(p.name for p in (tmp_path / "gn").iterdir()) == ["actor_0_0.json", "actor_1_0.json"]
    ok = run(
        tmp_path,
        "b",
        "--num-rollout",
        "2",
        "--load-debug-rollout-data",
        rec,
        "--ci-load-grad-norm",
        norms,
        "--ci-grad-norm-rtol",
        "0",
    )
    assert [c["ok"] for c in events(ok, "check") if c["checker"] == "grad_norm"] == [True, True]
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout",
            "2",
            "--load-debug-rollout-data",
            rec,
            "--ci-load-grad-norm",
            norms,
            "--ci-grad-norm-rtol",
            "0",
            "--entropy-coef",
            "0.01",
            "--run-dir",
            str(tmp_path / "c"),
        ]
    )
    assert code == 1  # an entropy bonus changes the gradient of the very first step
    assert "grad norm mismatch at rollout 0 step 0" in capsys.readouterr().err


def test_model_hash_saved_and_checked_on_resume(tmp_path: Path, capsys) -> None:
    ck = str(tmp_path / "ck")
    run(tmp_path, "a", "--num-rollout", "1", "--save", ck, "--ci-save-model-hash")
    hashes = json.loads((tmp_path / "ck" / "iter_0000001" / "model_hash_rank0.json").read_text())
    assert set(hashes) == {"layer_0000", "layer_0001", "layer_0002", "layer_0003", "non_layer"}
    resumed = run(
        tmp_path,
        "b",
        "--num-rollout",
        "2",
        "--load",
        ck,
        "--save",
        ck,
        "--ci-check-model-hash",
        "--ci-save-model-hash",
    )
    assert [c["ok"] for c in events(resumed, "check") if c["checker"] == "model_hash"] == [True]
    saved = tmp_path / "ck" / "iter_0000002" / "model_hash_rank0.json"
    tampered = {**json.loads(saved.read_text()), "layer_0002": "0" * 64}
    saved.write_text(json.dumps(tampered))
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout",
            "3",
            "--load",
            ck,
            "--ci-check-model-hash",
            "--run-dir",
            str(tmp_path / "c"),
        ]
    )
    assert code == 1
    assert "layer_0002" in capsys.readouterr().err


def test_metric_gate_fails_without_eval_and_below_threshold(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--ci-metric-checker-key", "eval/arith", "--ci-metric-checker-threshold", "0.5"])
    assert "needs an eval" in capsys.readouterr().err
    arith = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "arithmetic_test.jsonl"
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout",
            "1",
            "--eval-interval",
            "5",
            "--eval-prompt-data",
            "arith",
            str(arith),
            "--eval-max-prompts",
            "8",
            "--ci-metric-checker-key",
            "eval/arith",
            "--ci-metric-checker-threshold",
            "1.01",
            "--run-dir",
            str(tmp_path / "m"),
        ]
    )
    assert code == 1
    assert "eval/arith never reached 1.01" in capsys.readouterr().err


def test_fault_action_raise_in_train_and_bad_actions(tmp_path: Path, capsys) -> None:
    code = main(
        [
            "train",
            *SMALL,
            "--num-rollout",
            "3",
            "--ci-ft-test-actions",
            '[{"at_rollout": 1, "action": "raise_in_train"}]',
            "--run-dir",
            str(tmp_path / "r"),
        ]
    )
    assert code == 1  # the run failed (not bad input)
    assert "injected" in capsys.readouterr().err.lower()
    evs = events(tmp_path / "r")
    assert [e["rollout_id"] for e in evs if e["event"] == "fault"] == [1]
    assert evs[-1]["status"] == "failed" and evs[-1]["rollout_id"] == 1
    # stop_engine_at_end: tests/diagnose/test_engine_client.py::test_a_stopped_engine_stops_the_run
    with pytest.raises(SystemExit):
        main(["train", "--ci-ft-test-actions", '[{"at_rollout": 1, "action": "explode"}]'])
    assert "--ci-ft-test-actions: item 0" in capsys.readouterr().err
