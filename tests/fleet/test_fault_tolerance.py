"""--use-fault-tolerance on a launched fleet (core/engine/restart.py): a kill -9'd engine comes back with the
trainer's weights, checked before it rejoins the router, and the run's loss curve is the uninterrupted
run's bit for bit; a restart that skips the weight load (or loads other weights) is refused; past
--max-engine-restarts the run fails as without fault tolerance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runs import engines_after_first_metrics
from safetensors.torch import load_file

from grpolab.core.engine.client import EngineGoneError
from grpolab.core.engine.fleet import Fleet, FleetError
from grpolab.core.engine.http_calls import call_json
from grpolab.core.engine.restart import EngineRestartRefused, Restarter, WeightSource, load_weights
from grpolab.rundir.reader import read_events

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "tiny-qwen3"
SMALL = ["--num-rollout", "3", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-progress"]
KILLS = '[{"at_rollout": 1, "action": "kill_engine_in_rollout"}, {"at_rollout": 1, "action": "kill_engine_in_train"}]'


def _train(run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run_dir), *SMALL, *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def _curve(run_dir: Path) -> list[tuple]:
    """Every rollout, step and eval record (perf/* holds wall times)."""
    rows = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [(r["kind"], r["rollout_id"], r.get("step"), r["metrics"]) for r in rows if r["kind"] != "perf"]


def _perf(run_dir: Path, key: str) -> list[float]:
    rows = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r["metrics"][key] for r in rows if r["kind"] == "perf"]


@pytest.mark.slow
@pytest.mark.parametrize("fleet", [["--rollout-num-engines", "1"], ["--rollout-num-engines", "2", "--rollout-top-p", "0.9"]],
                         ids=["one_engine_router", "two_engines_direct"])  # fmt: skip
def test_killed_engines_restart_and_the_loss_curve_is_bitwise(tmp_path: Path, fleet: list[str]) -> None:
    """Engine 0 is killed while it holds rollout 1's requests, and again while rollout 1 trains (its memory
    released): both restarts load the trainer's weights and check version 2, the first's unanswered requests
    are sent again (to the restarted engine when it is the only one, else to engine 1 meanwhile), the second is found by the weight sync and released again, and every
    rollout and step metric equals the run without kills (--ci-test's weight checks pass too)."""
    plain = _train(tmp_path / "plain", *fleet, "--ci-test")
    assert plain.returncode == 0, plain.stderr[-3000:]
    killed = _train(
        tmp_path / "ft", *fleet, "--ci-test", "--use-fault-tolerance", "--ci-ft-test-actions", KILLS
    )
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert _curve(tmp_path / "ft") == _curve(tmp_path / "plain")
    restarts = [e for e in read_events(tmp_path / "ft") if e.get("event") == "engine_restart"]
    # one engine: its requests wait for it; two: engine 1 decodes engine 0's 16 as one batch meanwhile
    # (rollout 1's 16 requests: all wait for the one engine; of two, engine 0 held 8 and engine 1 took them)
    retried, retried_on = (16, "the restarted engine") if fleet[1] == "1" else (8, "engine 1")
    assert [(e["engine"], e["weight_version"], e["retried_requests"], e["retried_on"]) for e in restarts] == [
        (0, 2, retried, retried_on),
        (
            0,
            2,
            0,
            "",
        ),  # killed in training: found by the sync's first call (resume_memory), before the new version
    ]
    assert all("killed by SIGKILL" in e["reason"] and e["old_url"] != e["new_url"] for e in restarts)
    assert all(e["tensors"] > 0 and e["seconds"] > 0 for e in restarts), restarts
    assert _perf(tmp_path / "ft", "ft/engine_restarts") == [0.0, 2.0, 0.0]
    assert _perf(tmp_path / "ft", "ft/retried_requests") == [0.0, retried, 0.0]
    assert "ft/engine_restarts" not in (tmp_path / "plain" / "metrics.jsonl").read_text()
    log = (tmp_path / "ft" / "engines" / "0.log").read_text()
    assert log.count("grpolab serve: listening on ") == 3  # the first start and two restarts, one log


@pytest.mark.slow
def test_past_max_engine_restarts_the_run_fails_as_without_fault_tolerance(tmp_path: Path) -> None:
    done = _train(tmp_path / "run", "--rollout-num-engines", "1", "--use-fault-tolerance",
                  "--max-engine-restarts", "1", "--ci-ft-test-actions", KILLS)  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "killed by SIGKILL" in done.stderr and "--max-engine-restarts 1: none left" in done.stderr, (
        done.stderr[-3000:]
    )
    assert len([e for e in read_events(tmp_path / "run") if e.get("event") == "engine_restart"]) == 1


def _trained_weights() -> list[tuple[str, torch.Tensor]]:
    """The tiny model's tensors moved away from the checkpoint (as a trainer's are after a step)."""
    named = load_file(str(TINY / "model.safetensors"))
    return [(name, t + 0.01 if t.is_floating_point() else t) for name, t in sorted(named.items())]


def _workers(fleet: Fleet) -> dict[str, bool]:
    answer = call_json("GET", fleet.router_url + "/workers", None, timeout=10) or {}
    return {w["url"]: w["is_healthy"] for w in answer.get("workers", [])}


@pytest.mark.slow
def test_a_restart_that_skips_the_weight_load_is_not_registered(tmp_path: Path) -> None:
    """Planted restarts: one that loads nothing (the engine holds the checkpoint, version "default" as SGLang's), one that loads
    the checkpoint's weights under the trainer's version; both are refused before the router lists
    them; a load that fails makes the engine gone, saying so; a start that dies is tried again within the
    budget. A restart with the real load is registered healthy and holds the trainer's tensors."""
    trained = _trained_weights()
    source = WeightSource(named=lambda: iter(trained), buffer_bytes=1 << 20)
    fleet = Fleet.launch(checkpoint=str(TINY), num_engines=1, run_dir=tmp_path)
    try:
        checkpoint = load_file(str(TINY / "model.safetensors"))

        def load_the_checkpoint(url: str, _source: WeightSource, version: int) -> None:
            load_weights(
                url, WeightSource(named=lambda: iter(checkpoint.items()), buffer_bytes=1 << 20), version
            )

        planted = [
            (
                lambda url, src, version: None,
                "reports weight version default, the trainer's is 3: not registered",
            ),
            (load_the_checkpoint, "does not hold the trainer's weights of version 3: "),
        ]
        for load, refusal in planted:
            fleet.kill(0)
            restarter = Restarter(fleet, max_restarts=3, source=source, load=load)
            with pytest.raises(EngineRestartRefused, match=refusal):
                restarter.restart(0, reason="test", weight_version=3, memory_released=False)
            assert fleet.engines[0].url not in _workers(fleet) and not restarter.done

        def broken_load(url: str, _source: WeightSource, version: int) -> None:
            raise RuntimeError(f"{url}/update_weights_from_disk did not succeed")

        fleet.kill(0)
        with pytest.raises(EngineGoneError, match="exited; its restart failed: .*did not succeed"):
            Restarter(fleet, max_restarts=3, source=source, load=broken_load).bring_back(
                0, "engine 0 exited", weight_version=3, released=False
            )
        fleet.kill(0)
        restarter = Restarter(fleet, max_restarts=3, source=source)
        real = fleet.relaunch

        def dies_while_starting(i: int, **kw):  # the first start is killed before it listens
            fleet.relaunch = real
            raise FleetError("engine 0 exited with code -9 while starting")

        fleet.relaunch = dies_while_starting  # type: ignore[method-assign]
        record = restarter.bring_back(0, "engine 0 exited", weight_version=3, released=False)
        assert restarter.attempts == 2 and restarter.left == 1 and restarter.done == [record]
        assert record.failed_starts == 1
        fleet.kill(0)
        restarter = Restarter(fleet, max_restarts=3, source=source)
        record = restarter.restart(0, reason="test", weight_version=3, memory_released=False)
        assert _workers(fleet) == {record.new_url: True} and record.tensors == len(trained)
        info = call_json("GET", record.new_url + "/model_info", None, timeout=10)
        assert isinstance(info, dict) and info["weight_version"] == "3"
        assert restarter.take() == [record] and restarter.take() == []
    finally:
        fleet.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--use-fault-tolerance"], "--use-fault-tolerance needs --rollout-num-engines N"),
        (["--use-fault-tolerance", "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "9"],
         "restarts only the engines it launched (--sglang-router-ip names a running fleet)"),
        (["--rollout-num-engines", "1", "--use-fault-tolerance", "--max-engine-restarts", "0"],
         "--max-engine-restarts must be >= 1, got 0"),
        (["--rollout-num-engines", "1", "--use-fault-tolerance", "--ft-components", "train"],
         "grpolab has rollout fault tolerance only"),
        (["--rollout-num-engines", "1", "--max-engine-restarts", "2"], "--max-engine-restarts needs --use-fault-tolerance"),
        (["--rollout-num-engines", "1", "--ft-components", "rollout"], "--ft-components needs --use-fault-tolerance"),
        (["--rollout-num-engines", "1", "--use-fault-tolerance", "--debug-rollout-only"],
         "--debug-rollout-only builds no trainer"),
        (["--rollout-num-engines", "1", "--use-fault-tolerance", "--nproc-per-node", "2"], "runs on one rank"),
        (["--ci-ft-test-actions", '[{"at_rollout": 0, "action": "kill_engine_in_train"}]'],
         "item 0: kill_engine_in_train needs engines the run launches (--rollout-num-engines N)"),
    ],
)  # fmt: skip
def test_fault_tolerance_bad_input_exits_2(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    """Refused before the run directory or any engine exists."""
    from grpolab.cli import main

    try:
        code = main(["train", "--num-rollout", "2", *extra, "--run-dir", str(tmp_path / "run")])
    except SystemExit as e:
        code = e.code
    assert code == 2 and not (tmp_path / "run").exists()
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_hung_engine_is_killed_and_restarted(tmp_path: Path) -> None:
    """SIGSTOPped (the kernel accepts its connections, nothing answers): after --engine-failure-timeout the
    engine is killed and restarted like one that exited, and the run finishes."""
    import os
    import signal

    run = tmp_path / "run"
    argv = [sys.executable, "-m", "grpolab", "train", "--run-dir", str(run), *SMALL, "--num-rollout", "6",
            "--rollout-num-engines", "1", "--use-fault-tolerance", "--engine-failure-timeout", "5"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, engines = engines_after_first_metrics(proc, run)
        os.kill(engines[0], signal.SIGSTOP)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    restarts = [e for e in read_events(run) if e.get("event") == "engine_restart"]
    assert (
        len(restarts) == 1 and " hung (" in restarts[0]["reason"] and "was killed" in restarts[0]["reason"]
    ), restarts


def test_a_control_call_repeated_after_a_restart_skips_the_engines_that_answered(monkeypatch) -> None:
    """`/release_memory_occupation` twice is refused, so the repeat of a call that failed on engine 1 (a
    restart brought it back) goes to engine 1 only; the next call goes to both again."""
    from grpolab.core.engine.client import EngineRestarted
    from grpolab.core.engine.http_calls import HttpCallError
    from grpolab.core.engine.http_engine import HttpEngine

    engine = HttpEngine(
        router_url="http://r", engine_urls=["http://a", "http://b"], fleet=None, request_timeout_s=5
    )
    calls: list[str] = []
    failing = {"http://b"}

    def call(method: str, url: str, path: str, body: object, *, timeout: float) -> object:
        calls.append(url)
        if url in failing:
            failing.discard(url)
            raise HttpCallError(method, url + path, None, "timed out", timed_out=True)
        return {"url": url}

    def restarted(error: HttpCallError | None) -> None:
        raise EngineRestarted("engine 1 restarted")

    monkeypatch.setattr(engine._answers, "call", call)
    monkeypatch.setattr(engine, "_after_failed_call", restarted)
    with pytest.raises(EngineRestarted):
        engine._each_engine("POST", "/release_memory_occupation", {})
    assert engine._each_engine("POST", "/release_memory_occupation", {}) == [
        {"url": "http://a"},
        {"url": "http://b"},
    ]
    assert calls == ["http://a", "http://b", "http://b"]
    engine._each_engine("POST", "/release_memory_occupation", {})
    assert calls[3:] == ["http://a", "http://b"]


def test_a_restarting_engines_requests_go_to_the_next_engine_up_all_together(monkeypatch) -> None:
    """While engine 1 of 3 restarts, its requests (1, 4, 7) are held back in the round they were out in, then
    all go to engine 2 (one batch, as engine 1 would have decoded them); with engines 1 and 2 out, engine
    0 takes them; through the router everything stays on the router."""
    from grpolab.core.engine.http_engine import HttpEngine

    urls = ["http://a", "http://b", "http://c"]
    engine = HttpEngine(router_url="http://r", engine_urls=urls, fleet=None, request_timeout_s=5)
    out: set[int] = {1}

    class Underway:
        underway = out

    monkeypatch.setattr(engine, "restarter", Underway())
    assert [engine._target(True, i) for i in range(6)] == ["http://a", None, "http://c"] * 2
    assert {engine._target(True, i, moved=True) for i in (1, 4, 7)} == {"http://c"}
    out.add(2)
    assert {engine._target(True, i, moved=True) for i in (1, 2, 4, 5)} == {"http://a"}
    assert engine._live_urls() == ["http://a"]
    assert engine._target(False, 1) == engine._target(False, 1, moved=True) == "http://r"
