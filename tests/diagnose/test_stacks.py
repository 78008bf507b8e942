"""The py-spy parser on stored dumps of real gloo hangs (fixtures/pyspy/) and on edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpolab.diagnose.hang.stacks import (
    Frame,
    ProcessStack,
    format_frame,
    parse_pyspy,
    parse_pyspy_json,
    parse_pyspy_text,
    parse_pyspy_text_all,
    stack_to_dict,
)

PYSPY = Path(__file__).resolve().parents[2] / "fixtures" / "pyspy"
C10D = "torch/distributed/distributed_c10d.py"


def read(case: str, name: str) -> str:
    return (PYSPY / case / name).read_text(encoding="utf-8")


def meta(case: str) -> dict:
    return json.loads(read(case, "meta.json"))


def rank_pid(case: str, rank: int) -> int:
    return json.loads(read(case, f"ranks/{rank}.json"))["pid"]


def stored_dumps() -> list[tuple[str, int]]:
    found = []
    for case_dir in sorted(p for p in PYSPY.iterdir() if (p / "meta.json").exists()):
        for rank, alive in json.loads((case_dir / "meta.json").read_text())["alive"].items():
            if alive:
                found.append((case_dir.name, int(rank)))
    return found


def test_text_dump_of_a_rank_in_cleanup_barrier():
    stack = parse_pyspy_text(read("cleanup", "rank1.txt"))
    assert stack.pid == rank_pid("cleanup", 1)
    assert "--scenario cleanup" in stack.command
    assert len(stack.threads) == 1
    main = stack.main_thread
    assert main.name == "MainThread" and main.thread_id == stack.pid
    assert main.active is False and main.owns_gil is False
    names = [f.name for f in main.frames]
    assert names[:4] == ["barrier", "_exception_logger.<locals>.wrapper", "Trainer.close", "Trainer.__exit__"]
    assert main.frames[0].filename == C10D and main.frames[0].line > 0
    assert main.frames[2].filename.endswith("fixtures/hangs/hang_world.py")
    assert not any(f.native for f in main.frames)
    assert names[-1] == "<module>"


def test_two_threads_in_collectives_are_parsed_with_names():
    stack = parse_pyspy_text(read("threads", "rank0.txt"))
    assert [t.name for t in stack.threads] == ["MainThread", "grad-sync", "metrics-sync"]
    by_name = {t.name: t for t in stack.threads}
    assert by_name["grad-sync"].frames[0].name == "all_reduce"
    assert by_name["metrics-sync"].frames[0].name == "all_gather"
    assert by_name["MainThread"].frames[0].name == "Thread._wait_for_tstate_lock"
    assert stack.main_thread is by_name["MainThread"]


def test_busy_thread_is_active_and_holds_the_gil():
    busy = parse_pyspy_text(read("python_stall", "rank1.txt")).main_thread
    assert busy.active and busy.owns_gil
    assert busy.frames[0].name == "score_rollouts"
    waiting = parse_pyspy_text(read("python_stall", "rank0.txt")).main_thread
    assert not waiting.active and not waiting.owns_gil
    assert waiting.frames[0].name == "wait_for_scores"


def test_native_dump_has_c10d_and_libc_frames_without_line_numbers():
    native = parse_pyspy_text(read("mismatch", "rank0.native.txt"))
    frames = native.main_thread.frames
    native_frames = [f for f in frames if f.native]
    assert any(f.name == "c10d::Work::wait" and f.filename == "libtorch_cpu.so" for f in native_frames)
    assert any(f.name == "pthread_cond_wait" and f.filename.startswith("libc.so") for f in native_frames)
    assert all(f.line is None for f in native_frames)
    # a pybind11 frame name full of parentheses still parses into name + library
    assert any(f.name.endswith("::_FUN") and f.filename == "libtorch_python.so" for f in native_frames)
    # without the native frames it is the plain dump
    plain = parse_pyspy_text(read("mismatch", "rank0.txt"))
    assert native.main_thread.python_frames == plain.main_thread.frames
    assert native.signature() == plain.signature()


@pytest.mark.parametrize(("case", "rank"), stored_dumps())
def test_json_and_text_dumps_of_a_blocked_rank_agree(case, rank):
    text = parse_pyspy(read(case, f"rank{rank}.txt"))
    from_json = parse_pyspy(read(case, f"rank{rank}.json"))
    assert from_json.pid == text.pid == rank_pid(case, rank)
    assert [t.name for t in from_json.threads] == [t.name for t in text.threads]
    assert [t.thread_id for t in from_json.threads] == [t.thread_id for t in text.threads]
    if (case, rank) == ("python_stall", 1):
        return  # a busy loop: two dumps may catch different lines
    assert from_json.signature() == text.signature()
    assert parse_pyspy(read(case, f"rank{rank}.sample2.txt")).signature() == text.signature()


def test_json_keeps_full_paths_and_marks_native_frames_by_module():
    stack = parse_pyspy_json(read("cleanup", "rank0.json"))
    top = stack.main_thread.frames[0]
    assert top.name == "all_reduce" and top.filename == C10D
    assert top.full_filename.endswith("site-packages/" + C10D)
    assert stack.command is None  # py-spy --json gives no command line
    raw = [
        {
            "pid": 7,
            "thread_id": 1,
            "thread_name": "MainThread",
            "os_thread_id": 7,
            "active": False,
            "owns_gil": False,
            "frames": [
                {
                    "name": "pthread_cond_wait",
                    "filename": "/lib/libc.so.6",
                    "module": "/lib/libc.so.6",
                    "short_filename": "libc.so.6",
                    "line": 0,
                    "locals": None,
                },
                {
                    "name": "f",
                    "filename": "/x/f.py",
                    "module": None,
                    "short_filename": "f.py",
                    "line": 3,
                    "locals": None,
                },
            ],
            "process_info": {"pid": 7, "command_line": "python f.py", "parent": None},
        }
    ]
    parsed = parse_pyspy(json.dumps(raw))
    assert parsed.pid == 7 and parsed.command == "python f.py"
    assert parsed.main_thread.frames == (
        Frame("pthread_cond_wait", "libc.so.6", None, native=True, full_filename="/lib/libc.so.6"),
        Frame("f", "f.py", 3, native=False, full_filename="/x/f.py"),
    )


def test_locals_lines_are_skipped():
    with_locals = parse_pyspy_text(read("straggler", "rank1.locals.txt"))
    plain = parse_pyspy_text(read("straggler", "rank1.txt"))
    assert "Arguments:" in read("straggler", "rank1.locals.txt")
    assert with_locals.signature() == plain.signature()
    assert [f.name for f in with_locals.main_thread.frames][:2] == ["generate_rollouts", "run_straggler"]


def test_idle_thread_without_frames_hex_ids_colors_and_notes():
    text = (
        "py-spy> note: something py-spy printed first\n"
        "\x1b[1;33mProcess 41\x1b[0m: python x.py\n"
        "Python v3.12.1 (/usr/bin/python3.12)\n"
        "\n"
        'Thread 0x7F00AB (idle): "empty"\n'
        "Thread 42 (active)\n"
        "    spin (x.py:9)\n"
        'Thread 41 (idle): "MainThread"\n'
        "    <module> (x.py)\n"
    )
    stack = parse_pyspy_text(text)
    assert stack.pid == 41 and stack.command == "python x.py"
    empty, unnamed, main = stack.threads
    assert empty.thread_id == 0x7F00AB and empty.name == "empty" and empty.frames == ()
    assert unnamed.name is None and unnamed.active and not unnamed.owns_gil
    assert main.frames == (Frame("<module>", "x.py", None, native=False),)
    assert stack.main_thread is main


def test_subprocess_dumps_select_a_pid():
    one = read("mismatch", "rank0.txt")
    two = read("mismatch", "rank1.txt")
    combined = one + "\n" + "-" * 40 + "\n" + two
    both = parse_pyspy_text_all(combined)
    assert [p.pid for p in both] == [rank_pid("mismatch", 0), rank_pid("mismatch", 1)]
    second = parse_pyspy_text(combined, pid=rank_pid("mismatch", 1))
    assert second.main_thread.frames[0].name == "barrier"
    with pytest.raises(ValueError, match="not pid 5"):
        parse_pyspy_text(combined, pid=5)


@pytest.mark.parametrize(
    "junk",
    [
        "",
        "hello world\nthis is not a dump\n",
        "Error: Failed to find python version from target process\n\nStack backtrace:\n   0: anyhow\n",
        "[1, 2, 3]",
        '[{"pid": 1}]',
        "[{",
        '{"threads": []}',
    ],
)
def test_junk_is_rejected_with_a_clear_error(junk):
    with pytest.raises(ValueError, match="not py-spy"):
        parse_pyspy(junk)


def test_junk_error_quotes_the_first_line():
    with pytest.raises(ValueError, match="Error: Failed to find python version"):
        parse_pyspy_text("Error: Failed to find python version from target process\n")


def test_format_frame_and_dict_form():
    assert format_frame(Frame("all_reduce", C10D, 3252)) == f"all_reduce ({C10D}:3252)"
    assert (
        format_frame(Frame("pthread_cond_wait", "libc.so.6", None, native=True))
        == "pthread_cond_wait (libc.so.6)"
    )
    stack = parse_pyspy(read("threads", "rank1.json"))
    as_dict = stack_to_dict(stack)
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert [t["name"] for t in as_dict["threads"]] == ["MainThread", "metrics-sync", "grad-sync"]
    assert isinstance(stack, ProcessStack)


def test_stored_meta_matches_the_dumps():
    info = meta("exit")
    assert info["alive"] == {"0": True, "1": False, "2": True}
    assert info["exit_codes"]["1"] == 1
    assert not (PYSPY / "exit" / "rank1.txt").exists()
