"""`grpolab diagnose log` on the console.log of real failed runs: a dead engine and a raised fault.

A failed run's console.log must carry the injected-fault line and the final error (the terminal shows
each once, on stderr), and the log doctor must name them: `fault_injected` (info),
`engine_dead_timeout` and `train_failed` (errors).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runs import SMALL

from grpolab.cli import main
from grpolab.diagnose.logdoctor import main as doctor
from grpolab.diagnose.logdoctor.ruleset import LogRules
from grpolab.diagnose.logdoctor.scan import scan_file

ENGINE = "torch engine (tiny-qwen3, cpu)"


def test_dead_engine_run(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "dead"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpolab",
            "train",
            *SMALL,
            "--num-rollout",
            "3",
            "--ci-ft-test-actions",
            '[{"at_rollout": 0, "action": "stop_engine_at_end"}]',
            "--engine-failure-timeout",
            "2",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr  # the run failed (2 is bad input)
    fault = (
        "[grpolab fault] injecting stop_engine_at_end on rank 0 at rollout 0 (--ci-ft-test-actions item 0)"
    )
    # the terminal shows each line once, on stderr; console.log has them too
    assert proc.stderr.count(fault) == 1 and fault not in proc.stdout
    assert proc.stderr.count("grpolab train: error: ") == 1 and "grpolab train: error" not in proc.stdout
    console = (run_dir / "console.log").read_text()
    assert fault in console
    assert f"grpolab train: error: EngineDeadError: rollout engine '{ENGINE}' failed for" in console

    scan = scan_file(run_dir / "console.log")
    found = {f.rule: f for f in scan.findings}
    assert set(found) == {"fault_injected", "engine_dead_timeout"}
    info, dead = found["fault_injected"], found["engine_dead_timeout"]
    assert info.severity == "info" and info.details["faults"] == [
        {"action": "stop_engine_at_end", "rank": 0, "rollout": 0}
    ]
    assert dead.severity == "error" and dead.details["engine"] == ENGINE
    assert dead.details["failed_for_s"] >= 2.0 and dead.details["timeout_s"] == "2"
    assert dead.details["injected"] is True and "an injected CI fault" in dead.title
    assert (
        dead.details["engine_log"][0].endswith("device cpu")
        and "started with model" in dead.details["engine_log"][0]
    )
    assert dead.details["engine_log"][-1].endswith("shut down by fault injection stop_engine_at_end")
    notes = [e.note for e in dead.evidence]
    assert notes[0] == "first failure" and notes[1] == "" and set(notes[2:]) == {"quoted engine log"}
    lines = console.splitlines()
    assert all(lines[e.line - 1].startswith(e.text[:100]) for e in dead.evidence)
    assert dead.evidence[-1].text.endswith("shut down by fault injection stop_engine_at_end")
    assert f"injected at line {info.evidence[0].line}" in dead.cause

    # the CLI on the run directory: its console.log, exit 1 (an error finding)
    assert doctor([str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{run_dir / 'console.log'} (") and "ERROR   engine_dead_timeout:" in out


def test_raised_fault_run(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "raise"
    argv = ["train", *SMALL, "--num-rollout", "2", "--run-dir", str(run_dir)]
    code = main([*argv, "--ci-ft-test-actions", '[{"at_rollout": 1, "action": "raise_in_train"}]'])
    assert code == 1  # the run failed (2 is bad input)
    err = capsys.readouterr().err
    assert err.count("grpolab train: error: injected fault: raise_in_train on rank 0 at rollout 1") == 1
    console = (run_dir / "console.log").read_text().splitlines()
    error_line = (
        "grpolab train: error: InjectedFault: injected fault: raise_in_train on rank 0 at rollout 1 "
        "(--ci-ft-test-actions item 0)"
    )
    assert console[-1] == error_line and console[-2].startswith("[grpolab fault] injecting raise_in_train")
    found = {f.rule: f for f in scan_file(run_dir / "console.log").findings}
    assert set(found) == {"fault_injected", "train_failed"}
    failed = found["train_failed"]
    assert failed.severity == "error" and failed.details["type"] == "InjectedFault"
    assert failed.details["injected"] is True and [e.line for e in failed.evidence] == [len(console)]
    assert failed.title.startswith("grpolab train failed: InjectedFault: injected fault: raise_in_train")
    assert "events.jsonl" not in failed.cause  # console.log alone: the final status was not read
    # the run directory: rank 0's recorded error is console.log's line, so train_failed tells it, with
    # the final status read from events.jsonl
    assert doctor(["--json", str(run_dir)]) == 1
    (scan,) = json.loads(capsys.readouterr().out)["files"]
    assert [f["rule"] for f in scan["findings"]] == ["fault_injected", "train_failed"]
    cause = scan["findings"][1]["cause"]
    assert "The run directory's events.jsonl ends with status failed." in cause
    assert f"Rank 0 recorded it in {run_dir / 'ranks' / '0.json'}." in cause


def _feed(rules: LogRules, lines: list[str]) -> None:
    """Every line to the rules whose needles it holds, with the context they ask for."""
    for n, text in enumerate(lines, 1):
        held = [needle for needle in rules.needles if needle.decode() in text]
        if held:
            rules.on_line(held, n, text)
    rules.add_context((n, lines[n - 1]) for n in range(1, len(lines) + 1))


def test_dead_engine_from_a_terminal_capture_without_a_fault() -> None:
    """The command's stderr line (no exception type), a real engine, no injected fault: fix, not 'expected'."""
    rules = LogRules("run.out")
    _feed(
        rules,
        [
            "rollout 3: {'rollout/raw_reward': 0.5}",
            "rollout engine 'sglang (qwen3)': generate raised ConnectionError: refused; waiting up to 60 s "
            "(--engine-failure-timeout) for it to recover",
            "grpolab train: error: rollout engine 'sglang (qwen3)' failed for 60.4 s (--engine-failure-timeout "
            "60), the run stops instead of retrying forever; last error: generate raised ConnectionError: refused",
            "last engine log lines:",
            "  12:00:01 CUDA out of memory",
            "  12:00:02 scheduler exited",
            "something else",
        ],
    )
    found = {f.rule: f for f in rules.finish()}
    assert set(found) == {"engine_dead_timeout", "cuda_oom"}  # the engine's own last line is a finding too
    dead = found["engine_dead_timeout"]
    assert (dead.rule, dead.details["engine"], dead.details["failed_for_s"]) == (
        "engine_dead_timeout",
        "sglang (qwen3)",
        60.4,
    )
    assert dead.details["engine_log"] == ["12:00:01 CUDA out of memory", "12:00:02 scheduler exited"]
    assert dead.details["injected"] is False and dead.details["first_failure_line"] == 2
    assert [e.line for e in dead.evidence] == [2, 3, 5, 6]
    assert "grpolab watchdog" in dead.fix and "--engine-failure-timeout" in dead.fix
    assert dead.details["last_error"] == "generate raised ConnectionError: refused"


def test_a_plain_failure_is_an_error_without_a_fault() -> None:
    rules = LogRules("console.log")
    _feed(
        rules,
        ["step 0: {'train/loss': 0.1}", "grpolab train: error: ValueError: --load /x: no such directory"],
    )
    (failed,) = rules.finish()
    assert (failed.rule, failed.severity, failed.details["type"], failed.details["injected"]) == (
        "train_failed",
        "error",
        "ValueError",
        False,
    )
    assert failed.details["message"] == "--load /x: no such directory" and "names the flag" in failed.fix
