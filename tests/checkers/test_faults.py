"""--ci-ft-test-actions parsing (strict) and FaultInjector firing; real os._exit and real hangs in subprocesses."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpolab.checkers.faults import (
    FaultAction,
    FaultInjector,
    InjectedFault,
    check_reachable,
    parse_fault_actions,
)
from grpolab.cli import main


def test_parse_good() -> None:
    text = """[
        {"at_rollout": 2, "action": "crash_before_allreduce", "rank": 1},
        {"action": "raise_in_train", "at_rollout": 0},
        {"at_rollout": 5, "action": "sleep_forever_at_end", "rank": 0},
        {"at_rollout": 5, "action": "stop_engine_at_end"}
    ]"""
    assert parse_fault_actions(text) == [
        FaultAction(at_rollout=2, action="crash_before_allreduce", rank=1),
        FaultAction(at_rollout=0, action="raise_in_train", rank=0),
        FaultAction(at_rollout=5, action="sleep_forever_at_end", rank=0),
        FaultAction(at_rollout=5, action="stop_engine_at_end", rank=0),
    ]
    assert parse_fault_actions(" [] ") == []
    assert [a.point for a in parse_fault_actions(text)] == [
        "before_allreduce",
        "train",
        "end_of_rollout",
        "end_of_rollout",
    ]


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ('[{"at_rollout": 2, "action": "raise_in_train"', ["malformed JSON at line 1 column"]),
        ("", ["malformed JSON"]),
        (
            '{"at_rollout": 2, "action": "raise_in_train"}',
            ["expected a JSON array of action objects, got a JSON object"],
        ),
        ('[{"at_rollout": 1, "action": "raise_in_train"}, 3]', ["item 1: ", "expected an object, got 3"]),
        ('[{"at_rollout": 1, "action": "raise_in_train", "when": 2}]', ["item 0: ", "unknown field 'when'"]),
        (
            '[{"at_rollout": 1, "action": "raise_in_train", "cell_index": -1}]',
            ["item 0: ", "unknown field 'cell_index'", "Miles FT-cell field"],
        ),
        ('[{"action": "raise_in_train"}]', ["item 0: ", "missing required field 'at_rollout'"]),
        ('[{"at_rollout": 1}, {"at_rollout": 1}]', ["item 0: ", "missing required field 'action'"]),
        (
            '[{"at_rollout": true, "action": "raise_in_train"}]',
            ["item 0: ", "'at_rollout'", "got true (a JSON boolean)"],
        ),
        ('[{"at_rollout": "2", "action": "raise_in_train"}]', ["'at_rollout'", 'got "2" (a JSON string)']),
        ('[{"at_rollout": 2.0, "action": "raise_in_train"}]', ["'at_rollout'", "got 2.0 (a JSON number)"]),
        ('[{"at_rollout": null, "action": "raise_in_train"}]', ["'at_rollout'", "got null (a JSON null)"]),
        (
            '[{"at_rollout": -1, "action": "raise_in_train"}]',
            ["'at_rollout' must be an integer >= 0, got -1"],
        ),
        (
            '[{"at_rollout": 1, "action": "raise_in_train", "rank": false}]',
            ["item 0: ", "'rank'", "(a JSON boolean)"],
        ),
        ('[{"at_rollout": 1, "action": "raise_in_train", "rank": -2}]', ["'rank' must be an integer >= 0"]),
        ('[{"at_rollout": 1, "action": 5}]', ["item 0: ", "field 'action' must be a string, got 5"]),
        (
            '[{"at_rollout": 1, "action": "explode"}]',
            ["item 0: ", "unknown action 'explode'", "valid: crash_before_allreduce, raise_in_train"],
        ),
        ('[{"at_rollout": 1, "action": "stop_cell_at_end"}]', ["unknown action", "Miles FT-cell action"]),
        (
            '[{"at_rollout": 1, "action": "raise_in_train", "at_rollout": 2}]',
            ["item 0: ", "field 'at_rollout' is given twice"],
        ),
        (
            '[{"at_rollout": 1, "action": "raise_in_train"}, {"action": "raise_in_train", "at_rollout": 1}]',
            ["item 1: ", "duplicates item 0"],
        ),
    ],
)
def test_parse_bad_names_flag_item_and_field(text: str, needles: list[str]) -> None:
    with pytest.raises(ValueError) as e:
        parse_fault_actions(text)
    msg = str(e.value)
    assert msg.startswith("--ci-ft-test-actions: ")
    for needle in needles:
        assert needle in msg


def test_raise_in_train_fires_once_on_its_rank_and_rollout() -> None:
    actions = parse_fault_actions('[{"at_rollout": 2, "action": "raise_in_train", "rank": 1}]')
    seen: list[tuple[str, int]] = []
    rank0 = FaultInjector(actions, rank=0)
    rank1 = FaultInjector(actions, rank=1, on_fire=lambda a, r: seen.append((a.action, r)))
    for rollout_id in range(4):
        assert rank0.maybe_fire("train", rollout_id) == []
    assert rank1.maybe_fire("train", 1) == []
    assert rank1.maybe_fire("end_of_rollout", 2) == []
    assert rank1.pending() == actions
    with pytest.raises(
        InjectedFault, match=r"raise_in_train on rank 1 at rollout 2 \(--ci-ft-test-actions item 0\)"
    ):
        rank1.maybe_fire("train", 2)
    assert seen == [("raise_in_train", 2)]
    assert rank1.maybe_fire("train", 2) == []  # once
    assert rank1.pending() == [] and rank0.pending() == []
    assert issubclass(InjectedFault, RuntimeError)


def test_stop_engine_calls_back_once_and_non_terminal_fires_first() -> None:
    actions = parse_fault_actions(
        '[{"at_rollout": 1, "action": "raise_in_train"}, {"at_rollout": 1, "action": "stop_engine_at_end"}]'
    )
    stops: list[int] = []
    injector = FaultInjector(actions, rank=0, on_stop_engine=lambda: stops.append(1))
    assert injector.maybe_fire("end_of_rollout", 0) == []
    assert injector.maybe_fire("end_of_rollout", 1) == [actions[1]]
    assert injector.maybe_fire("end_of_rollout", 1) == []
    assert stops == [1]
    with pytest.raises(InjectedFault):
        injector.maybe_fire("train", 1)


def test_injector_validation() -> None:
    stop = parse_fault_actions(
        '[{"at_rollout": 0, "action": "raise_in_train"}, {"at_rollout": 0, "action": "stop_engine_at_end"}]'
    )
    with pytest.raises(
        ValueError, match=r"--ci-ft-test-actions: item 1: stop_engine_at_end needs a running engine"
    ):
        FaultInjector(stop, rank=0)
    FaultInjector(stop, rank=1)  # not this rank's action: nothing to stop
    far = parse_fault_actions('[{"at_rollout": 0, "action": "raise_in_train", "rank": 2}]')
    with pytest.raises(ValueError, match=r"item 0: field 'rank': rank 2 does not exist \(world size 2\)"):
        FaultInjector(far, rank=0, world_size=2)
    with pytest.raises(ValueError, match="unknown fault point 'backward'"):
        FaultInjector(far, rank=2).maybe_fire("backward", 0)


def _script(body: str) -> list[str]:
    prelude = "import sys\nfrom grpolab.checkers.faults import FaultInjector, parse_fault_actions\n"
    return [sys.executable, "-c", prelude + textwrap.dedent(body)]


def test_crash_before_allreduce_exits_1(tmp_path: Path) -> None:
    marker = tmp_path / "fired.txt"
    body = f"""
        actions = parse_fault_actions('[{{"at_rollout": 2, "action": "crash_before_allreduce", "rank": 1}}]')
        inj = FaultInjector(actions, rank=1, on_fire=lambda a, r: open({str(marker)!r}, "w").write(f"{{a.action}} {{r}}"))
        for rollout_id in range(4):
            inj.maybe_fire("train", rollout_id)
            inj.maybe_fire("before_allreduce", rollout_id)
            print("allreduce", rollout_id, flush=True)
        print("AFTER LOOP")
    """
    proc = subprocess.run(_script(body), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout.split("\n") == ["allreduce 0", "allreduce 1", ""]
    assert "[grpolab fault] injecting crash_before_allreduce on rank 1 at rollout 2" in proc.stderr
    assert marker.read_text() == "crash_before_allreduce 2"


def test_sleep_forever_at_end_really_hangs(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.txt"
    body = """
        actions = parse_fault_actions(
            '[{"at_rollout": 1, "action": "sleep_forever_at_end"}, {"at_rollout": 1, "action": "stop_engine_at_end"}]'
        )
        inj = FaultInjector(actions, rank=0, on_stop_engine=lambda: print("ENGINE STOPPED", file=sys.stderr, flush=True))
        inj.maybe_fire("end_of_rollout", 0)
        inj.maybe_fire("end_of_rollout", 1)
        print("RETURNED", file=sys.stderr, flush=True)
    """
    with open(stderr, "w") as err:
        proc = subprocess.Popen(_script(body), stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while "sleep_forever_at_end" not in stderr.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, stderr.read_text()
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None  # still asleep: a real hang
    finally:
        proc.kill()
        proc.wait(timeout=10)
    lines = stderr.read_text().splitlines()
    assert lines == [
        "[grpolab fault] injecting stop_engine_at_end on rank 0 at rollout 1 (--ci-ft-test-actions item 1)",
        "ENGINE STOPPED",
        "[grpolab fault] injecting sleep_forever_at_end on rank 0 at rollout 1 (--ci-ft-test-actions item 0)",
    ]


@pytest.mark.parametrize("rank", [0, 1])
def test_the_fault_line_reaches_console_log_once_on_the_terminal(tmp_path: Path, rank: int) -> None:
    """In a run (the grpolab logger set up, console.log attached) the line also lands in console.log,
    on rank 1 too (whose logger keeps warnings only); the terminal gets it once, on stderr."""
    console = tmp_path / "console.log"
    body = f"""
        import logging
        from grpolab.rundir.writer import setup_console_logging
        setup_console_logging(quiet={rank != 0})
        handler = logging.FileHandler({str(console)!r})
        logging.getLogger("grpolab").addHandler(handler)
        actions = parse_fault_actions('[{{"at_rollout": 0, "action": "crash_before_allreduce", "rank": {rank}}}]')
        FaultInjector(actions, rank={rank}).maybe_fire("before_allreduce", 0)
    """
    proc = subprocess.run(_script(body), capture_output=True, text=True, timeout=120)
    line = f"[grpolab fault] injecting crash_before_allreduce on rank {rank} at rollout 0 (--ci-ft-test-actions item 0)"
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [line]
    assert proc.stdout == ""
    assert console.read_text().splitlines() == [line]  # written before os._exit


def test_an_action_past_the_last_rollout_is_refused_at_start(tmp_path: Path, capsys) -> None:
    """An at_rollout >= --num-rollout never fires: refused (exit 2) naming the item, before a run dir."""
    actions = parse_fault_actions(
        '[{"at_rollout": 1, "action": "raise_in_train"}, {"at_rollout": 2, "action": "stop_engine_at_end"}]'
    )
    check_reachable(actions, num_rollout=3)
    with pytest.raises(
        ValueError, match=r"item 1: field 'at_rollout' is 2 but --num-rollout 2 runs rollouts 0\.\.1"
    ):
        check_reachable(actions, num_rollout=2)
    run_dir = tmp_path / "r"
    for extra, table, needle in (  # refused before torch, no run directory: they would never fire
        (
            [],
            '[{"at_rollout": 1, "action": "raise_in_train"}]',
            "--ci-ft-test-actions: item 0: field 'at_rollout' is 1",
        ),
        (
            [],
            '[{"at_rollout": 0, "action": "raise_in_train", "rank": 1}]',
            "rank 1 does not exist (world size 1)",
        ),
        (
            ["--debug-rollout-only"],
            '[{"at_rollout": 0, "action": "raise_in_train"}]',
            "--debug-rollout-only trains",
        ),
    ):
        argv = ["train", "--num-rollout", "1", "--ci-ft-test-actions", table, "--run-dir", str(run_dir)]
        with pytest.raises(SystemExit) as info:
            main([*argv, *extra])
        assert info.value.code == 2 and needle in capsys.readouterr().err and not run_dir.exists()


def test_config_validation_parses_the_table_through_its_hook_in_a_fresh_process() -> None:
    """The config imports no checker: the faults table is parsed by checkers/faults.py, which registers
    its parser with the config's validation hook (core/config/validation.py). Before that module is
    imported a section skips the check; once it is, a bad table fails the section, naming the flag."""
    script = textwrap.dedent(
        """
        import sys
        from grpolab.core.config import CIConfig
        assert "grpolab.checkers.faults" not in sys.modules
        CIConfig(ci_ft_test_actions='[{"at_rollout": -1, "action": "raise_in_train"}]')  # no check yet
        import grpolab.checkers.faults
        try:
            CIConfig(ci_ft_test_actions='[{"at_rollout": -1, "action": "raise_in_train"}]')
        except ValueError as e:
            print(e)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.startswith("--ci-ft-test-actions: item 0: field 'at_rollout'"), out
