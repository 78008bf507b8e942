"""`grpolab diagnose log RUN_DIR` on real killed-engine run directories (tests/diagnose/fixtures, see its
README): console.log, router.log and engines/<i>.log read together, the story told engine first, then the
router, then the trainer; `engine_gone` for an engine whose process exited, not `engine_dead_timeout`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from grpolab.diagnose.logdoctor import main
from grpolab.diagnose.logdoctor.last_words import KIND_KILLED, KIND_OOM, KIND_TRACEBACK, last_words
from grpolab.diagnose.logdoctor.model import Line
from grpolab.diagnose.logdoctor.run_logs import EngineLog
from grpolab.diagnose.logdoctor.scan import scan_file

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KILLED = FIXTURES / "killed_engine_run"
BETWEEN = FIXTURES / "killed_between_rollouts_run"
OLD = FIXTURES / "killed_before_is_gone_run"
HUNG = FIXTURES / "hung_engine_run"
SEGFAULT = FIXTURES / "segfault_engine_run"
URL = "http://127.0.0.1:39025"  # engine 0 of killed_engine_run (its engines/0.log: listening on)


def _line_of(path: Path, text: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def _findings(report: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for file in report["files"]:
        for f in file["findings"]:
            out.setdefault(f["rule"], []).append(f)
    return out


def test_a_killed_engine_run_is_told_engine_first_then_router_then_trainer(capsys) -> None:
    code, report = _report(capsys, str(KILLED))
    assert code == 1 and report["exit_code"] == 1
    names = [Path(f["file"]).relative_to(KILLED).as_posix() for f in report["files"]]
    assert names == ["engines/0.log", "router.log", "console.log"]
    found = _findings(report)
    assert "engine_dead_timeout" not in found  # the engine exited: not a timeout
    (gone,) = found["engine_gone"]
    assert gone["title"].startswith(f"engine 0 ({URL}) is gone (killed by SIGKILL): the run stopped")
    d = gone["details"]
    assert (d["engine_index"], d["url"], d["state"], d["hung"]) == (0, URL, "killed by SIGKILL", False)
    assert d["engine_log_file"] == str(KILLED / "engines" / "0.log")
    assert d["router"] == {"failed_sends": 16, "health_failures": {"connection refused": 1}}
    cited = [(Path(e["file"]).name, e["line"]) for e in gone["evidence"]]
    assert cited == [
        ("0.log", 1),  # the engine log's last line: a SIGKILL leaves no message (lines 2-3 are the router's
        # probe noise, "Invalid HTTP request received.", and were cited as the engine's last words)
        ("router.log", _line_of(KILLED / "router.log", "Failed to send typed request")),
        ("router.log", _line_of(KILLED / "router.log", "HTTP health check failed for")),
        ("console.log", _line_of(KILLED / "console.log", "waiting up to 60 s")),
        ("console.log", _line_of(KILLED / "console.log", "grpolab train: error:")),
    ]
    assert "SIGKILL comes from outside the process" in gone["cause"]
    assert "16 failed sends" in gone["cause"] and "RUN_DIR/engines/0.log" in gone["fix"]
    # the router's own finding names the engine behind the URL and quotes its log
    (router,) = found["router_engine_errors"]  # console.log's copy of the quoted router lines is dropped
    assert router["evidence"][0]["file"] == str(KILLED / "router.log")
    assert router["details"]["engine_logs"] == {URL: str(KILLED / "engines" / "0.log")}
    assert f"engine 0 is {URL}" in router["cause"]


def test_the_grpolab_command_on_the_run_directory() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "grpolab", "diagnose", "log", str(KILLED)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert f"ERROR   engine_gone: engine 0 ({URL}) is gone (killed by SIGKILL)" in done.stdout
    assert f"{KILLED / 'engines' / '0.log'}:1 " in done.stdout and done.stderr == ""


def test_the_text_report_cites_each_file_and_line(capsys) -> None:
    assert main([str(KILLED)]) == 1
    out = capsys.readouterr().out
    gone = out[out.index("ERROR   engine_gone:") :]
    assert f"{KILLED / 'engines' / '0.log'}:1 " in gone and "Invalid HTTP request" not in gone
    assert (
        f"{KILLED / 'router.log'}:{_line_of(KILLED / 'router.log', 'Failed to send typed request')} " in gone
    )
    assert out.index(f"{KILLED / 'engines' / '0.log'} (") < out.index(f"{KILLED / 'router.log'} (")
    assert out.index(f"{KILLED / 'router.log'} (") < out.index(f"{KILLED / 'console.log'} (")


def test_an_engine_killed_between_rollouts_is_gone_at_once(capsys) -> None:
    """The engine client's `rollout engine '<name>' is gone: engine 0 (URL) exited (killed by SIGKILL); ...`."""
    code, report = _report(capsys, str(BETWEEN))
    assert code == 1
    found = _findings(report)
    assert set(found) == {"engine_gone"}, set(found)  # not train_failed, not engine_dead_timeout
    (gone,) = found["engine_gone"]
    assert (
        gone["title"]
        == "engine 0 (http://127.0.0.1:38731) is gone (killed by SIGKILL): the run stopped at the next call to it"
    )
    assert gone["details"]["failed_for_s"] is None and gone["details"]["engine_index"] == 0
    cited = [(Path(e["file"]).name, e["line"], e["note"]) for e in gone["evidence"]]
    assert cited == [
        ("0.log", 1, "engine log: its last lines"),  # 2-3: the router's probe noise, left out
        ("console.log", _line_of(BETWEEN / "console.log", "' is gone: engine 0"), "the trainer's error"),
    ]


def test_the_message_before_is_gone_is_engine_gone_too(capsys) -> None:
    """Runs made before the is-gone message: 'failed for 0.0 s' with an EngineGoneError as last error."""
    code, report = _report(capsys, str(OLD))
    assert code == 1
    found = _findings(report)
    assert set(found) == {"engine_gone"}, set(found)
    (gone,) = found["engine_gone"]
    assert (
        gone["title"]
        == "engine 0 (http://127.0.0.1:38883) is gone (killed by SIGKILL): the run stopped at the next call to it"
    )
    assert gone["details"]["failed_for_s"] == 0.0
    assert [(Path(e["file"]).name, e["line"]) for e in gone["evidence"]][:1] == [("0.log", 1)]


def test_a_stopped_engine_is_a_timeout_told_with_the_engines_log(capsys) -> None:
    """A SIGSTOPped engine is alive: engine_dead_timeout stays, and the story names the engine its error's
    URL belongs to and quotes that engine's own log first."""
    code, report = _report(capsys, str(HUNG))
    assert code == 1
    found = _findings(report)
    assert set(found) == {"engine_dead_timeout"}, set(found)
    (dead,) = found["engine_dead_timeout"]
    assert dead["details"]["failed_for_s"] == 20.0 and dead["details"]["timeout_s"] == "10"
    assert (dead["details"]["engine_index"], dead["details"]["url"]) == (0, "http://127.0.0.1:46215")
    cited = [(Path(e["file"]).name, e["line"], e["note"]) for e in dead["evidence"]]
    assert cited == [
        ("0.log", 1, "engine log: its last lines"),
        ("console.log", _line_of(HUNG / "console.log", "waiting up to 10 s"), "first failure"),
        ("console.log", _line_of(HUNG / "console.log", "grpolab train: error:"), ""),
    ]
    assert "The engine is engine 0 at http://127.0.0.1:46215" in dead["cause"]


def test_a_crashed_engines_fatal_error_is_quoted_first(capsys) -> None:
    code, report = _report(capsys, str(SEGFAULT))
    assert code == 1
    files = report["files"]
    assert [Path(f["file"]).name for f in files] == ["0.log", "console.log"]
    assert [f["rule"] for f in files[0]["findings"]] == ["segfault"]  # the engine's own log, first
    (gone,) = _findings(report)["engine_gone"]
    assert gone["title"] == (
        "engine 0 (http://127.0.0.1:38861) is gone (killed by SIGSEGV): the run stopped at the next call to it; its log "
        "ends with a fatal Python error"
    )
    engine_log = SEGFAULT / "engines" / "0.log"
    cited = [(Path(e["file"]).name, e["line"]) for e in gone["evidence"]]
    assert cited[:3] == [
        ("0.log", _line_of(engine_log, "Fatal Python error: Segmentation fault")),
        ("0.log", _line_of(engine_log, "Current thread 0x")),
        ("0.log", _line_of(engine_log, "Current thread 0x") + 1),  # its innermost frame
    ]
    assert cited[3] == ("console.log", _line_of(SEGFAULT / "console.log", "' is gone: engine 0"))
    assert "a crash in native code" in gone["cause"]
    assert gone["details"]["engine_log_ends_with"] == "a fatal Python error"


def test_a_single_file_is_scanned_alone_as_before(capsys) -> None:
    console = KILLED / "console.log"
    code, report = _report(capsys, str(console))
    assert code == 1 and [f["file"] for f in report["files"]] == [str(console)]
    found = _findings(report)
    (gone,) = found["engine_gone"]
    assert {e["file"] for e in gone["evidence"]} == {str(console)}  # only what the file holds
    assert [e["note"] for e in gone["evidence"]][-1] == "quoted engine log"
    assert "router_engine_errors" in found  # the quoted router lines, with no router.log beside it
    router = scan_file(KILLED / "router.log")
    assert [f.rule for f in router.findings] == ["router_engine_errors"]
    assert "engine_logs" not in router.findings[0].details


def test_a_run_directory_without_console_log_tells_the_routers_story(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(KILLED, run, ignore=shutil.ignore_patterns("console.log"))
    code, report = _report(capsys, str(run))
    assert code == 1
    assert [Path(f["file"]).name for f in report["files"]] == ["0.log", "router.log"]
    (router,) = _findings(report)["router_engine_errors"]
    assert router["details"]["engine_logs"] == {URL: str(run / "engines" / "0.log")}
    assert [(Path(e["file"]).name, e["line"]) for e in router["evidence"]][-1:] == [("0.log", 1)]


def test_a_directory_without_any_log_says_what_it_expected(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        f"grpolab diagnose log: cannot read {tmp_path}: a directory without console.log, router.log or "
        "engines/<i>.log: give a log file or a grpolab run directory"
    ) in err


def test_the_is_gone_message_and_a_hung_engine(tmp_path: Path) -> None:
    """core/engine/client.py's `rollout engine '<name>' is gone: <what went>` (EngineDeadError, gone=True),
    for an exited engine and for one core/engine/liveness.py gave up on."""
    name = "sglang fleet (1 engine behind http://127.0.0.1:41000)"
    log = tmp_path / "console.log"
    log.write_text(
        f"grpolab train: error: EngineDeadError: rollout engine '{name}' is gone: engine 1 "
        "(http://127.0.0.1:41002) has not answered GET /health for 10.3 s (hung: --engine-failure-timeout 10 "
        "treats it as dead)\nlast engine log lines:\n  [engines/1.log] grpolab serve: listening on "
        "http://127.0.0.1:41002\n"
    )
    found = {f.rule: f for f in scan_file(log).findings}
    assert set(found) == {"engine_gone"}  # neither train_failed nor engine_dead_timeout
    gone = found["engine_gone"]
    assert gone.title.startswith(
        "engine 1 (http://127.0.0.1:41002) is gone (hung: no answer to GET /health for 10.3 s)"
    )
    assert gone.details["hung"] and gone.details["engine_index"] == 1
    assert "alive but stopped answering" in gone.cause and "py-spy dump" in gone.fix
    assert gone.details["engine_log"] == [
        "[engines/1.log] grpolab serve: listening on http://127.0.0.1:41002"
    ]


def _raised() -> list[str]:
    try:
        {}["weights"]  # a real exception, formatted as Python prints it to an engine's stderr
    except KeyError:
        return "".join(traceback.format_exception(*sys.exc_info())).splitlines()
    raise AssertionError("no exception")


def test_an_engine_logs_traceback_is_quoted() -> None:
    lines = ["grpolab serve: listening on http://127.0.0.1:5", *_raised(), "INFO:     Shutting down"]
    tail = tuple(Line(i, text) for i, text in enumerate(lines, 1))
    words = last_words(EngineLog(0, "engines/0.log", "http://127.0.0.1:5", tail[0], tail))
    assert words.kind == KIND_TRACEBACK and words.summary == "KeyError: 'weights'"
    head, frame, exception = words.lines
    assert head.text == "Traceback (most recent call last):" and head.line == 2
    assert frame.text.strip().startswith(f'File "{__file__}"') and "_raised" in frame.text
    assert exception.text == "KeyError: 'weights'" and exception.line == len(lines) - 1
    killed = (Line(7, "Killed"),)
    assert last_words(EngineLog(0, "f", None, None, killed)).kind == KIND_KILLED
    oom = (Line(3, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),)
    assert last_words(EngineLog(0, "f", None, None, oom)).kind == KIND_OOM
