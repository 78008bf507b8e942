"""`grpolab check parity` holds its ladder against planted faults: each fault fails its own rung first,
and the clean ladder passes (the tiny model, 4 prompts of 12 tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpolab.cli import main
from grpolab.core import sequence_forward
from grpolab.core.engine.torch_engine import TorchEngine

FAST = ["check", "parity", "--num-prompts", "4", "--batch-size", "4", "--rollout-max-response-len", "12"]


def ladder(capsys: pytest.CaptureFixture, *extra: str, world: bool = False) -> tuple[int, dict]:
    code = main([*FAST, *extra, "--json", *([] if world else ["--no-world-size"])])
    return code, json.loads(capsys.readouterr().out)


def passed(report: dict) -> dict[str, bool]:
    return {r["name"]: r["passed"] for r in report["rungs"]}


def test_the_clean_ladder_passes_with_top_p_top_k(capsys: pytest.CaptureFixture) -> None:
    code, report = ladder(capsys, "--rollout-top-p", "0.9", "--rollout-top-k", "20", world=True)
    assert code == 0 and report["failed"] is None
    exact = [r for r in report["rungs"] if r["bar"] == "bitwise"]
    assert [r["name"] for r in exact] == ["trainer vs engine, each answer alone (--true-on-policy-mode)",
                                          "trainer world size 1 vs 2 (gloo)"]  # fmt: skip
    assert all(r["equal"] == r["total"] > 0 and r["max_abs"] == 0.0 for r in exact)
    assert len(report["greedy"]) == 4


def test_baseline_names_the_rungs_that_moved_and_what_changed(capsys, tmp_path: Path) -> None:
    """`--baseline` against an earlier `--json` report: a rung whose numbers moved is named with both
    figures, then the environment key (MKL's reproducibility mode) and the flag that differ."""
    code, report = ladder(capsys)
    assert code == 0 and report["environment"]["torch"] == torch.__version__
    assert report["settings"]["num_prompts"] == 4
    report["environment"]["deterministic"]["MKL_CBWR"] = "COMPATIBLE"
    report["settings"]["rollout_top_p"] = 0.5
    moved = next(r for r in report["rungs"] if r["name"] == "trainer vs engine")
    moved["max_abs"] += 1.0
    baseline = tmp_path / "before.json"
    baseline.write_text(json.dumps(report))
    code, again = ladder(capsys, "--baseline", str(baseline))
    lines = again["moved"]
    assert code == 0 and lines[0] == f"parity moved since --baseline {baseline}:"
    assert [line for line in lines if line.startswith("  trainer vs engine:")]
    assert not [line for line in lines if line.startswith("  trainer micro-batch")]  # unmoved rungs stay out
    assert "  env deterministic.MKL_CBWR: 'COMPATIBLE' -> None" in lines
    assert "  flags rollout_top_p: 0.5 -> 1.0" in lines
    baseline.write_text(json.dumps(again | {"moved": []}))
    assert ladder(capsys, "--baseline", str(baseline))[1]["moved"] == [
        f"parity: every rung as in --baseline {baseline}"
    ]


def test_a_batch_dependent_op_fails_the_batch_rung_first(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    real = TorchEngine._generate_chunk

    def batch_dependent(self, reqs, params):  # noqa: ANN001, ANN202
        out = real(self, reqs, params)
        for r in out:
            r.log_probs = r.log_probs + 1e-4 * (len(reqs) - 1)  # a request alone is untouched
        return out

    monkeypatch.setattr(TorchEngine, "_generate_chunk", batch_dependent)
    code, report = ladder(capsys)
    assert code == 1 and report["failed"] == "a request alone vs in a batch (random companions)"
    assert passed(report)["engine decode vs engine prefill"]


def test_a_micro_batch_dependent_normalisation_fails_the_trainer_rung(capsys, monkeypatch) -> None:
    real = sequence_forward.padded_log_probs

    def normalised(model, mb, *, temperature):  # noqa: ANN001, ANN202
        lp, logits, K = real(model, mb, temperature=temperature)
        return (
            lp + 1e-4 * (mb.input_ids_BL.shape[0] - 1),
            logits,
            K,
        )  # one row (the engine's prefill) untouched

    monkeypatch.setattr(sequence_forward, "padded_log_probs", normalised)
    code, report = ladder(capsys)
    assert code == 1 and report["failed"] == "trainer micro-batch 1 vs N"
    ok = passed(report)
    assert ok["engine decode vs engine prefill"] and ok["a request alone vs in a batch (random companions)"]


def test_a_reordered_reduction_in_one_engine_layer_fails_only_the_bitwise_rung(capsys, monkeypatch) -> None:
    """The engine's layer-0 down projection summed in another order (three uneven pieces, last first):
    ~1e-7 apart, inside --tol, not bitwise."""
    real_init = TorchEngine.__init__

    def reordered(self, *args, **kwargs):  # noqa: ANN001, ANN202
        real_init(self, *args, **kwargs)
        proj = self.model.model.layers[0].mlp.down_proj
        W = proj.weight

        def reordered_sum(x: torch.Tensor) -> torch.Tensor:
            a, b = 101, 257
            return (x[..., b:] @ W[:, b:].T + x[..., a:b] @ W[:, a:b].T) + x[..., :a] @ W[:, :a].T

        proj.forward = reordered_sum

    monkeypatch.setattr(TorchEngine, "__init__", reordered)
    code, report = ladder(capsys)
    assert code == 1 and report["failed"] == "trainer vs engine, each answer alone (--true-on-policy-mode)"
    assert sum(not ok for ok in passed(report).values()) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-prompts", "0"], "--num-prompts must be >= 1"),
        (["--rollout-dtype", "float64x"], "--rollout-dtype"),
        (["--hf-checkpoint", "/nonexistent/model"], "--hf-checkpoint /nonexistent/model"),
        (["--prompt-data", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
        (["--baseline", "/nonexistent.json"], "--baseline /nonexistent.json: no such file"),
        (["--baseline", "NOTJSON"], "not JSON"),
        (["--baseline", "LIST"], "expected a `grpolab check parity --json` report"),
        (["--baseline", "NULLMAX"], "numbers `equal`, `total`, `max_abs`"),
        (["--server", "127.0.0.1:30000"], "expected http://HOST:PORT"),
    ],
)
def test_bad_input_exits_2(capsys, flags: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "null.json").write_text(json.dumps({"environment": {}, "rungs": [{"name": "x", "equal": 1, "total": 1,
                                                                                 "max_abs": None}]}))  # fmt: skip
    swap = {
        "NOTJSON": str(tmp_path / "bad.json"),
        "LIST": str(tmp_path / "list.json"),
        "NULLMAX": str(tmp_path / "null.json"),
    }
    flags = [swap.get(f, f) for f in flags]
    assert main(["check", "parity", *flags]) == 2
    assert message in capsys.readouterr().err
