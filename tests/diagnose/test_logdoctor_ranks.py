"""`grpolab diagnose log` on a multi-rank failure: the root cause first, not the knock-on error.

One real 2-rank run (gloo on CPU) where rank 1 raises an injected fault at rollout 0. Rank 0 then either
fails in its next collective with gloo's "Connection closed by peer" (recorded in ranks/0.json, status
failed), or is stopped by torchrun's SIGTERM first (nothing recorded, status interrupted): which comes
first is a race, the one tests/train/test_multirank.py accepts. Whichever it was, rank 1's fault must be
the doctor's verdict, in the run directory's ranks/*.json errors (root cause first) and in the terminal
capture of the same run (every rank prints its own last line); events.jsonl's status may only be claimed
when a run directory was read. The slow variant forces the second order (rank 0 asleep before its
collectives when rank 1 raises), so both are checked. The rest are small hand-made cases of the same
ordering rules.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpolab.diagnose.common.rank_errors import RankError
from grpolab.diagnose.logdoctor import main as doctor
from grpolab.diagnose.logdoctor.ruleset import LogRules
from grpolab.diagnose.logdoctor.run_outcome import RecordedError, RunOutcome, read_run_outcome
from grpolab.diagnose.logdoctor.scan import scan_file
from grpolab.rundir.reader import final_status_event

FAULT = '[{"at_rollout": 0, "action": "raise_in_train", "rank": 1}]'
INJECTED = "injected fault: raise_in_train on rank 1 at rollout 0 (--ci-ft-test-actions item 0)"
STOPPED = "grpolab train: interrupted (signal 15)"
"""Rank 0's last console.log line when torchrun's SIGTERM stops it (core/interrupts.py, train/run_end.py)."""
STOP_RANK0_FIRST = """
import os
if os.environ.get("RANK") == "0" and "LOCAL_RANK" in os.environ:  # rank 0 of torchrun only
    import time
    from grpolab.checkers import faults
    fire = faults.FaultInjector.maybe_fire
    def maybe_fire(self, point, rollout_id):
        if (point, rollout_id) == ("train", 0):  # where rank 1 raises: rank 0 is before its collectives
            time.sleep(60)  # torchrun's SIGTERM (rank 1 exited) ends the sleep with KeyboardInterrupt
        return fire(self, point, rollout_id)
    faults.FaultInjector.maybe_fire = maybe_fire
"""
"""A sitecustomize.py for the forced order: imported by every interpreter of the run, it acts in rank 0 only."""


@dataclass(frozen=True)
class TwoRanks:
    """The failed 2-rank run: its directory, the terminal capture (stdout and stderr in one file), and
    whether rank 0 recorded the lost peer connection (else torchrun stopped it first)."""

    run_dir: Path
    capture: Path
    rank0_lost_peer: bool


@pytest.fixture(
    scope="module",
    params=["as_it_happens", pytest.param("rank0_stopped_first", marks=pytest.mark.slow)],
)
def failed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TwoRanks:
    tmp = tmp_path_factory.mktemp("two_ranks")
    run_dir, capture = tmp / "F", tmp / "terminal.log"
    argv = [
        *("train", "--nproc-per-node", "2", "--num-rollout", "2", "--rollout-batch-size", "2"),
        *("--n-samples-per-prompt", "2", "--rollout-max-response-len", "8", "--no-progress"),
        *("--run-dir", str(run_dir), "--ci-ft-test-actions", FAULT),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if request.param == "rank0_stopped_first":
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(STOP_RANK0_FIRST)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp / "site"), env.get("PYTHONPATH")) if p)
    with open(capture, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "grpolab", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
            env=env,
        )
    text = capture.read_text()
    assert proc.returncode == 1, text[-3000:]
    errors = {r: json.loads((run_dir / "ranks" / f"{r}.json").read_text()).get("error", "") for r in (0, 1)}
    assert errors[1].startswith(f"InjectedFault: {INJECTED}\n"), errors  # the crashed rank's error, always
    status = (final_status_event(run_dir) or {}).get("status")
    console = (run_dir / "console.log").read_text()
    if errors[0]:  # rank 0's collective noticed rank 1's exit before torchrun stopped it
        assert "Connection closed by peer" in errors[0] and status == "failed", (errors, status)
    else:  # torchrun's SIGTERM stopped rank 0 first: it says so, and recorded no error of its own
        assert status == "interrupted" and console.rstrip().endswith(STOPPED), (status, console[-500:])
    if request.param == "rank0_stopped_first":
        assert not errors[0], f"the forced order did not happen: rank 0 recorded {errors[0][:300]!r}"
    return TwoRanks(run_dir, capture, rank0_lost_peer=bool(errors[0]))


def test_run_directory_reports_rank_errors_root_cause_first(failed: TwoRanks, capsys) -> None:
    run_dir = failed.run_dir
    console = (run_dir / "console.log").read_text()
    # what QA saw: console.log has rank 0's output only, not rank 1's fault
    assert "[grpolab fault] injecting" not in console and "InjectedFault" not in console

    assert doctor(["--json", str(run_dir)]) == 1
    (scan,) = json.loads(capsys.readouterr().out)["files"]
    findings = scan["findings"]
    root = findings[0]  # the verdict names rank 1's fault, whatever rank 0 did
    assert (root["rule"], root["severity"], root["details"]["rank"]) == ("rank_error", "error", 1)
    assert (
        root["details"]["root_cause"] and root["details"]["injected"] and root["details"]["log_line"] is None
    )
    assert re.search(r"checkers/faults\.py:\d+ in _fire$", root["details"]["frames"][-1])
    (evidence,) = root["evidence"]
    assert evidence["file"] == str(run_dir / "ranks" / "1.json")
    rank_file = (run_dir / "ranks" / "1.json").read_text().splitlines()
    assert rank_file[evidence["line"] - 1].startswith(evidence["text"][:100])
    assert evidence["text"].startswith('  "error": "InjectedFault: injected fault: raise_in_train on rank 1')
    assert "console.log holds rank 0's output only" in root["cause"]
    assert root["fix"] == "Nothing to fix if the fault was meant (--ci-ft-test-actions)."
    if not failed.rank0_lost_peer:  # rank 1's is the only recorded error, and console.log prints none
        assert len(findings) == 1 and root["title"] == f"rank 1 failed: InjectedFault: {INJECTED}"
        assert "grpolab train: error: " not in console and evidence["note"] == ""
        return

    assert console.count("grpolab train: error: ") == 1 and "Connection closed by peer" in console
    assert [(f["rule"], f["severity"], f["details"]["rank"]) for f in findings] == [
        ("rank_error", "error", 1),
        ("rank_error", "info", 0),
    ]  # train_failed says nothing: rank 0's finding carries console.log's error line
    knock_on = findings[1]
    assert root["title"] == f"rank 1 failed first: InjectedFault: {INJECTED}"
    assert evidence["note"] == "root cause"
    assert "The run ended with status failed (events.jsonl's last line)." in root["cause"]
    assert "rank 0" in root["cause"]

    assert knock_on["details"]["peer_connection_error"] and not knock_on["details"]["root_cause"]
    assert knock_on["title"].startswith("rank 0: RuntimeError: ") and knock_on["title"].endswith(
        "(a consequence of rank 1's failure)"
    )
    files = [(e["file"], e["note"]) for e in knock_on["evidence"]]
    assert files == [
        (
            str(run_dir / "ranks" / "0.json"),
            "a consequence: lost the connection to a peer after rank 1 failed",
        ),
        (str(run_dir / "console.log"), "the run's final error line"),
    ]
    assert console.splitlines()[knock_on["evidence"][1]["line"] - 1].startswith(
        "grpolab train: error: Runtime"
    )

    # the text report: the root cause is the first finding, each recorded error is named once
    assert doctor([str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert out.index("ERROR   rank_error: rank 1 failed first: InjectedFault") < out.index(
        "INFO    rank_error: rank 0"
    )
    assert f"{run_dir / 'ranks' / '1.json'}:{evidence['line']}" in out


def test_terminal_capture_headlines_the_first_rank_to_fail(failed: TwoRanks) -> None:
    lines = failed.capture.read_text().splitlines()
    errors = [n for n, text in enumerate(lines, 1) if text.startswith("grpolab train: error: ")]
    summary = [n for n in errors if "its error is above" in lines[n - 1]]  # the launcher's last line
    assert summary == [errors[-1]] and lines[-1].startswith("grpolab train: error: rank 1 failed")
    errors = errors[:-1]
    root_line = next(n for n in errors if INJECTED in lines[n - 1])  # rank 1 printed its fault
    found = {f.rule: f for f in scan_file(failed.capture).findings}
    assert set(found) == {"fault_injected", "train_failed"}
    failed_ = found["train_failed"]
    assert failed_.title == f"grpolab train failed: {INJECTED}"  # not the gloo line, wherever it is
    assert failed_.details["root_line"] == root_line and failed_.details["injected"] is True
    assert "events.jsonl" not in failed_.cause  # a plain log: events.jsonl was never read
    notes = {e.line: e.note for e in failed_.evidence}
    if not failed.rank0_lost_peer:  # rank 0 printed that it was interrupted, not an error
        assert errors == [root_line] and failed_.details["lines"] == 1 and notes == {root_line: ""}
        assert "grpolab train: interrupted; the run directory's last event says so" in lines
        assert failed_.details["consequence_lines"] == []
        return
    assert len(errors) == 2  # each rank prints its own; which comes first is up to the two processes
    fault_line = next(n for n, text in enumerate(lines, 1) if "another rank's process ended" in text)
    assert fault_line in errors and fault_line != root_line
    assert failed_.details["consequence_lines"] == [fault_line] and failed_.details["lines"] == 2
    assert notes[root_line] == "root cause"
    assert (
        notes[fault_line]
        == f"a consequence: lost the connection to a peer after the error at line {root_line}"
    )
    assert f"error line {fault_line} reports a lost connection to a peer" in failed_.cause


def test_status_is_only_claimed_from_a_run_directory(failed: TwoRanks) -> None:
    run_dir = failed.run_dir
    console = run_dir / "console.log"
    outcome = read_run_outcome(run_dir)
    if not failed.rank0_lost_peer:  # console.log alone holds rank 0's interruption: no failure to tell
        assert scan_file(console).findings == []
        assert outcome.last_status == "interrupted" and [r.error.rank for r in outcome.rank_errors] == [1]
        return
    # console.log alone: rank 0's error is all there is; nothing about events.jsonl
    (alone,) = scan_file(console).findings
    assert alone.rule == "train_failed" and "Connection closed by peer" in alone.title
    assert "events.jsonl" not in alone.cause and "events.jsonl" not in alone.source
    assert outcome.last_status == "failed" and [r.error.rank for r in outcome.rank_errors] == [1, 0]
    # one recorded error that console.log prints: train_failed tells it, with the final status
    only_rank0 = RunOutcome(str(run_dir), outcome.rank_errors[1:], "failed")
    (told,) = scan_file(console, run=only_rank0).findings
    assert told.rule == "train_failed"
    assert "The run directory's events.jsonl ends with status failed." in told.cause
    assert f"Rank 0 recorded it in {run_dir / 'ranks' / '0.json'}." in told.cause
    (unfinished,) = scan_file(console, run=RunOutcome(str(run_dir), outcome.rank_errors[1:], None)).findings
    assert "events.jsonl" not in unfinished.cause


# ---------------------------------------------------------------------- hand-made cases
def _feed(rules: LogRules, lines: list[str]) -> list:
    for n, text in enumerate(lines, 1):
        held = [needle for needle in rules.needles if needle.decode() in text]
        if held:
            rules.on_line(held, n, text)
    return rules.finish()


GLOO = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:25987"
NCCL = "DistBackendError: NCCL error: remote process exited or there was a network error"


def test_log_lines_every_one_a_lost_peer_and_a_second_problem() -> None:
    # torchrun --tee prefixes: the root cause's rank names the consequences
    (f,) = _feed(
        LogRules("torchrun.log"),
        [
            f"[rank0]:grpolab train: error: {GLOO}",
            "[rank2]:grpolab train: error: ValueError: --lr must be > 0",
            f"[rank1]:grpolab train: error: {NCCL}",
            "[rank3]:grpolab train: error: KeyError: 'x'",
        ],
    )
    assert f.title == "grpolab train failed: ValueError: --lr must be > 0" and f.details["rank"] == 2
    assert [(e.line, e.note) for e in f.evidence] == [
        (1, "a consequence: lost the connection to a peer after rank 2"),
        (2, "root cause"),
        (3, "a consequence: lost the connection to a peer after rank 2"),
        (4, "another error"),
    ]
    assert f.details["consequence_lines"] == [1, 3] and f.details["other_lines"] == [4]
    assert "error lines 1, 3 report a lost connection" in f.cause and "error line 4 is not a lost" in f.cause
    # only lost connections: the earliest is headlined, and nothing is called a consequence of it
    (g,) = _feed(LogRules("x.log"), [f"grpolab train: error: {NCCL}", f"grpolab train: error: {GLOO}"])
    assert g.title.startswith("grpolab train failed: DistBackendError") and g.details["root_line"] == 1
    assert [e.note for e in g.evidence] == [
        "earliest; a lost peer connection",
        "lost the connection to a peer",
    ]
    assert "the rank that failed first did not print its error to this log" in g.cause


def _recorded(rank: int, error: str, time: float) -> RecordedError:
    return RecordedError(RankError(rank, error, time), f"R/ranks/{rank}.json", 7, f'  "error": "{error}"')


def test_rank_errors_that_are_all_lost_connections_name_no_culprit() -> None:
    run = RunOutcome("R", (_recorded(1, NCCL, 10.0), _recorded(0, GLOO, 11.0)), None)
    root, other = _feed(LogRules("R/console.log", run=run), [f"grpolab train: error: {GLOO}"])
    assert (root.rule, root.severity, root.details["rank"], root.details["label"]) == (
        "rank_error",
        "error",
        1,
        "earliest recorded",
    )
    assert root.title.startswith(
        "rank 1 recorded the earliest error, a lost peer connection: DistBackendError"
    )
    assert "did not record its exception" in root.cause and "dmesg" in root.fix
    assert (other.severity, other.details["rank"]) == ("info", 0) and other.title.endswith(
        "(a lost peer connection too)"
    )
    assert [e.file for e in other.evidence] == ["R/ranks/0.json", "R/console.log"]
    # a second rank with its own exception is an error of its own
    run = RunOutcome(
        "R", (_recorded(1, "ValueError: bad", 10.0), _recorded(2, "KeyError: 'x'", 12.0)), "failed"
    )
    first, second = _feed(LogRules("R/console.log", run=run), ["rollout 0: {'rollout/raw_reward': 0.5}"])
    assert first.title == "rank 1 failed first: ValueError: bad" and first.details["log_line"] is None
    assert (second.severity, second.title) == ("error", "rank 2 failed too: KeyError: 'x'")
    # one recorded error missing from the log (a rank other than 0): still reported
    run = RunOutcome("R", (_recorded(1, "ValueError: bad", 10.0),), None)
    (only,) = _feed(LogRules("R/console.log", run=run), [])
    assert only.title == "rank 1 failed: ValueError: bad" and only.evidence[0].note == ""


def test_read_run_outcome(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    (run / "console.log").write_text("grpolab train: error: ValueError: bad\n")
    (run / "ranks" / "0.json").write_text(
        json.dumps({"rank": 0, "pid": 10, "heartbeat": {"time": 5.0}, "error": "ValueError: bad"}, indent=2)
    )
    (run / "ranks" / "1.json").write_text("{not json")
    events = [{"event": "run_start"}, {"event": "status", "status": "failed", "error": "x" * 200_000}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + "\n")
    outcome = read_run_outcome(run)
    assert outcome.last_status == "failed"  # a last line longer than one read, a blank line after it
    (recorded,) = outcome.rank_errors
    written = (run / "ranks" / "0.json").read_text().splitlines()
    line = written.index('  "error": "ValueError: bad"') + 1
    assert (recorded.file, recorded.line, recorded.text) == (
        str(run / "ranks" / "0.json"),
        line,
        written[line - 1],
    )
    assert len(outcome.problems) == 1 and "1.json: not valid JSON" in outcome.problems[0]
    assert doctor([str(run)]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("1.json: not valid JSON") == 1 and "1.json" not in captured.out
    assert "ERROR   train_failed: grpolab train failed: ValueError: bad" in captured.out
    # a run still going: no final status; a directory with console.log alone: no rank errors
    (run / "events.jsonl").write_text(json.dumps(events[0]) + "\n" + json.dumps({"event": "status"}))
    assert read_run_outcome(run).last_status is None
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "console.log").write_text("")
    assert read_run_outcome(bare) == RunOutcome(str(bare))
