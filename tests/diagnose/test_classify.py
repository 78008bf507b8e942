"""The hang classifier on stored py-spy dumps of real gloo hangs, plus synthetic precedence cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpolab.diagnose.hang.stacks import Frame, ProcessStack, ThreadStack, parse_pyspy
from grpolab.diagnose.hang.verdict.classify import VERDICT_KINDS, classify, render_table
from grpolab.diagnose.hang.verdict.frames import find_collective, is_library_frame
from grpolab.diagnose.hang.verdict.rank_rows import RankObservation

PYSPY = Path(__file__).resolve().parents[2] / "fixtures" / "pyspy"
C10D = "torch/distributed/distributed_c10d.py"
LOGGER = "torch/distributed/c10d_logger.py"


def observations(case: str, dump: str = "txt", *, second_sample: bool = True) -> list[RankObservation]:
    """RankObservations built from a stored case the way `diagnose hang` builds them from a run dir."""
    folder = PYSPY / case
    meta = json.loads((folder / "meta.json").read_text())
    found = []
    for rank in range(meta["world_size"]):
        record = json.loads((folder / "ranks" / f"{rank}.json").read_text())
        alive = meta["alive"][str(rank)]
        stacks: tuple[ProcessStack, ...] = ()
        if alive:
            stacks = (parse_pyspy((folder / f"rank{rank}.{dump}").read_text()),)
            if second_sample:
                stacks += (parse_pyspy((folder / f"rank{rank}.sample2.txt").read_text()),)
        found.append(
            RankObservation(
                rank=rank,
                pid=record["pid"],
                alive=alive,
                stacks=stacks,
                heartbeat_age_s=meta["captured_at"] - record["heartbeat"]["time"],
                heartbeat_phase=record["heartbeat"]["phase"],
                exception=record.get("error"),
                exit_code=meta["exit_codes"][str(rank)],
            )
        )
    return found


EXPECTED = {
    "cleanup": ("cleanup_deadlock", "A"),
    "crash": ("cleanup_deadlock", "A"),
    "mismatch": ("mismatched_collectives", "B"),
    "mismatch_2ranks": ("mismatched_collectives", "B"),
    "straggler": ("same_collective", "C"),
    "exit": ("rank_exited", None),
    "threads": ("threads_same_group", None),
    "python_stall": ("python_stall", None),
}


@pytest.mark.parametrize("dump", ["txt", "json", "native.txt"])
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_each_stored_hang_gets_its_verdict(case, dump):
    verdict = classify(observations(case, dump))
    assert (verdict.kind, verdict.pattern) == EXPECTED[case]
    assert verdict.hung
    assert [row.rank for row in verdict.rows] == list(range(len(verdict.rows)))
    assert verdict.next_steps


def test_cleanup_deadlock_starts_with_the_exception_and_names_the_teardown():
    verdict = classify(observations("cleanup"))
    assert verdict.evidence[0].startswith("rank 1 raised RuntimeError: reward tensor has shape (7,)")
    assert "compute_loss" in verdict.evidence[1]
    teardown = next(line for line in verdict.evidence if "stuck in teardown" in line)
    assert teardown.startswith("rank 1 ") and "barrier (" in teardown
    assert "Trainer.close" in teardown and "Trainer.__exit__" in teardown
    assert "rank 1" in verdict.title and "ranks 0, 2 wait in all_reduce" in verdict.title
    states = {row.rank: row.state for row in verdict.rows}
    assert states == {0: "collective", 1: "teardown", 2: "collective"}
    assert verdict.rows[0].collective == "all_reduce"
    assert verdict.rows[0].call_site.startswith("train_step (")
    assert verdict.rows[1].collective == "barrier" and verdict.rows[1].call_site.startswith("Trainer.close (")
    assert verdict.next_steps[0].startswith("Fix the exception on rank 1 first: RuntimeError")
    nccl = " ".join(classify(observations("cleanup"), backend="nccl").next_steps)
    for variable in (
        "NCCL_DEBUG=INFO",
        "TORCH_DISTRIBUTED_DEBUG=DETAIL",
        "timeout=timedelta(seconds=300)",
        "CUDA_LAUNCH_BLOCKING=1",
    ):
        assert variable in nccl


def test_timeout_and_debug_advice_follow_the_backend():
    """torch's default timeout is 10 min for NCCL, 30 min for gloo; NCCL_DEBUG only for NCCL runs."""
    nccl = " ".join(classify(observations("cleanup"), backend="nccl").next_steps)
    assert "torch's default is 10 min for NCCL)" in nccl and "NCCL_DEBUG=INFO" in nccl
    assert "NCCL_TIMEOUT=300, as in the AReaL guide, works only where the launcher reads it" in nccl
    gloo = " ".join(classify(observations("cleanup"), backend="gloo").next_steps)
    assert "torch's default is 30 min for gloo)" in gloo and "TORCH_CPP_LOG_LEVEL=INFO" in gloo
    assert "NCCL_DEBUG" not in gloo and "CUDA_LAUNCH_BLOCKING" not in gloo
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in gloo
    unknown = " ".join(classify(observations("straggler", second_sample=False)).next_steps)
    assert "10 min for NCCL, 30 min for gloo" in unknown and "NCCL_DEBUG" not in unknown
    same = classify(
        [rank(0, in_collective("all_reduce", "step")), rank(1, in_collective("all_reduce", "step"))]
    )
    assert "GLOO_SOCKET_IFNAME" not in same.next_steps[0] and "NCCL_DEBUG" not in same.next_steps[0]
    gloo_same = classify(
        [rank(0, in_collective("all_reduce", "step")), rank(1, in_collective("all_reduce", "step"))],
        backend="gloo",
    )
    assert "GLOO_SOCKET_IFNAME" in gloo_same.next_steps[0]


def test_nccl_native_frames_make_nccl_advice():
    waits = (Frame("c10d::ProcessGroupNCCL::WorkNCCL::wait", "libtorch_cuda.so", None, native=True),)
    obs = [
        rank(0, waits + in_collective("all_reduce", "step")),
        rank(1, in_collective("all_reduce", "step")),
    ]
    steps = " ".join(classify(obs).next_steps)
    assert "NCCL_DEBUG=INFO" in steps and "10 min for NCCL)" in steps
    assert classify(obs, backend="gloo").next_steps == classify(obs).next_steps  # frames say NCCL


def test_root_cause_exception_comes_before_a_lost_peer_connection():
    """Rank 0 failed because rank 1's sockets closed; rank 1's own error is the one to fix."""
    peer = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:19102"
    verdict = classify(
        [
            rank(0, None, exception=peer, heartbeat_age_s=3.0),
            rank(1, None, exception="InjectedFault: injected fault: raise_in_train", heartbeat_age_s=4.0),
            rank(2, in_collective("all_reduce", "train_step"), heartbeat_age_s=50.0),
        ]
    )
    assert verdict.kind == "cleanup_deadlock"
    assert verdict.evidence[0] == "rank 1 raised InjectedFault: injected fault: raise_in_train"
    assert verdict.next_steps[0].startswith("Fix the exception on rank 1 first: InjectedFault")


def test_a_rank_that_exited_after_an_exception_is_pattern_a():
    verdict = classify(observations("crash"))
    assert verdict.evidence[0].startswith("rank 1 raised RuntimeError")
    assert "rank 1 exited with exit code 1 after that exception" in verdict.evidence
    assert "rank 1 exited after an exception" in verdict.title
    assert verdict.rows[1].state == "exited" and verdict.rows[1].where == "exited"


def test_mismatch_names_the_rank_missing_the_collective():
    verdict = classify(observations("mismatch"))
    missing = [line for line in verdict.evidence if "missing the collective the others wait in" in line]
    assert len(missing) == 1
    assert missing[0].startswith(
        "rank 1 is missing the collective the others wait in (all_reduce ← train_step"
    )
    assert "barrier ← save_checkpoint" in missing[0]
    assert verdict.title.startswith("Mismatched collectives (pattern B): rank 1 waits in barrier, ranks 0, 2")
    assert "save_checkpoint" in verdict.next_steps[0]


def test_mismatch_with_two_ranks_has_no_majority():
    verdict = classify(observations("mismatch_2ranks"))
    missing = [line for line in verdict.evidence if "missing the collective" in line]
    assert [line.split(" is missing")[0] for line in missing] == ["rank 0", "rank 1"]
    assert "barrier ← save_checkpoint" in missing[0] and "all_reduce ← train_step" in missing[1]


def test_straggler_is_named_with_the_slowest_heartbeat():
    verdict = classify(observations("straggler"))
    assert "rank 1 has not arrived (straggler)" in verdict.title
    assert "ranks 0, 2 wait in all_reduce" in verdict.title
    assert any(
        line.startswith("slowest heartbeat: rank 1,") and "phase rollout" in line for line in verdict.evidence
    )
    row = verdict.rows[1]
    assert row.state == "idle" and row.where.startswith("generate_rollouts (")
    assert "rank 1" in verdict.next_steps[0] and "generate_rollouts" in verdict.next_steps[0]


def test_exited_rank_without_exception():
    obs = observations("exit")
    verdict = classify(obs)
    assert verdict.title == "Rank 1 exited; ranks 0, 2 wait in all_reduce for it"
    assert verdict.evidence[0] == f"rank 1 (pid {obs[1].pid}) is gone (exit code 1) and recorded no exception"
    assert "exited (exit code 1)" in render_table(verdict)


def test_threads_in_collectives_are_named():
    verdict = classify(observations("threads"))
    assert "'grad-sync' (all_reduce)" in verdict.title and "'metrics-sync' (all_gather)" in verdict.title
    assert verdict.evidence[0].startswith("rank 0: thread grad-sync in all_reduce")
    assert verdict.evidence[1].startswith("rank 1: thread metrics-sync in all_gather")


def test_python_stall_shows_the_busy_thread():
    verdict = classify(observations("python_stall"))
    assert verdict.title.startswith(
        "Python-side stall, no rank in a collective: rank 1 thread MainThread is busy"
    )
    assert "score_rollouts (" in verdict.title
    assert {row.rank: row.state for row in verdict.rows} == {0: "idle", 1: "python"}


def test_native_frames_are_supporting_evidence_only():
    verdict = classify(observations("mismatch", "native.txt", second_sample=False))
    assert verdict.rows[0].where.startswith("all_reduce (" + C10D)
    assert verdict.rows[0].native_wait == "c10d::Work::wait (libtorch_cpu.so)"
    assert (
        "native frames show ranks 0, 1, 2 blocked in c10d::Work::wait (libtorch_cpu.so)" in verdict.evidence
    )


def test_two_samples_mark_unchanged_stacks():
    verdict = classify(observations("mismatch"))
    assert all(row.unchanged is True for row in verdict.rows)
    assert "stacks unchanged between the two samples on ranks 0, 1, 2" in verdict.evidence
    single = classify(observations("mismatch", second_sample=False))
    assert all(row.unchanged is None for row in single.rows)


def test_progress_means_not_hung_and_the_dict_form_is_json():
    verdict = classify(observations("mismatch"), progressed=True)
    assert verdict.kind == "not_hung" and not verdict.hung and verdict.pattern is None
    as_dict = classify(observations("cleanup")).to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert as_dict["kind"] in VERDICT_KINDS and as_dict["hung"] is True
    assert as_dict["rows"][1]["state"] == "teardown"


def test_render_table_has_one_line_per_rank():
    obs = observations("threads")
    table = render_table(classify(obs)).splitlines()
    assert table[0].split() == ["rank", "pid", "state", "heartbeat", "where"]
    assert len(table) == 3
    assert table[1].split()[:3] == ["0", str(obs[0].pid), "collective"]
    assert "[grad-sync] all_reduce (" in table[1]


# ------------------------------------------------------------------------------ synthetic stacks
def frame(name: str, filename: str = "train.py", line: int | None = 10) -> Frame:
    return Frame(name, filename, line)


def in_collective(collective: str, caller: str, *, line: int = 40, outer: tuple[Frame, ...] = ()) -> tuple:
    return (
        frame(collective, C10D, 100),
        frame("_exception_logger.<locals>.wrapper", LOGGER, 83),
        frame(caller, "train.py", line),
        *outer,
        frame("<module>", "train.py", 1),
    )


def process(pid: int, *threads: tuple[str, tuple[Frame, ...], bool]) -> ProcessStack:
    return ProcessStack(
        pid=pid,
        command="python train.py",
        threads=tuple(
            ThreadStack(thread_id=pid + i, name=name, active=active, owns_gil=active, frames=frames)
            for i, (name, frames, active) in enumerate(threads)
        ),
    )


def rank(r: int, frames: tuple[Frame, ...] | None, **kwargs) -> RankObservation:
    stacks = () if frames is None else (process(100 + r, ("MainThread", frames, False)),)
    return RankObservation(
        rank=r, pid=100 + r, alive=kwargs.pop("alive", frames is not None), stacks=stacks, **kwargs
    )


def test_exception_beats_a_plain_exit():
    verdict = classify(
        [
            rank(0, in_collective("all_reduce", "train_step")),
            rank(1, None, exception='ValueError: bad reward\n  File "r.py", line 3, in score', exit_code=1),
            rank(2, None, exit_code=-9),
        ]
    )
    assert verdict.kind == "cleanup_deadlock" and verdict.pattern == "A"
    assert verdict.evidence[0] == "rank 1 raised ValueError: bad reward"
    assert verdict.evidence[1] == 'rank 1 exception raised at: File "r.py", line 3, in score'
    # not "same collective": pattern C (network, slow peer) needs every rank alive
    assert verdict.evidence[-1] == "also fits: rank exited"


def test_barrier_reached_after_the_peer_left_is_an_extra_collective():
    """Rank 1 ended its loop (heartbeat phase finished) and exited; rank 0 waits in a barrier inside
    save_checkpoint that only it calls. It was rank_exited with "also fits: same collective"."""
    save = in_collective("barrier", "save_checkpoint", outer=(frame("train", "train.py", 90),))
    verdict = classify(
        [
            rank(0, save, heartbeat_age_s=3.0, heartbeat_phase="save"),
            rank(1, None, heartbeat_age_s=2.0, heartbeat_phase="finished"),
        ],
        backend="gloo",
    )
    assert verdict.kind == "extra_collective" and verdict.pattern is None and verdict.hung
    assert verdict.title == (
        "Extra collective on rank 0, reached after the peer left: barrier ← save_checkpoint (train.py:40); "
        "rank 1 finished and exited, so no rank will join it"
    )
    assert verdict.evidence[0] == (
        "rank 1 (pid 101) is gone (unknown exit code) and recorded no exception; its last heartbeat is "
        "phase finished: it ended its loop and left"
    )
    assert verdict.evidence[1].startswith(
        "rank 0 waits in barrier (torch/distributed/distributed_c10d.py:100)"
    )
    assert verdict.evidence[1].endswith(
        "a collective no running peer will call: it was reached after rank 1 left"
    )
    assert not any("same collective" in e or e.startswith("also fits") for e in verdict.evidence)
    assert verdict.next_steps[0].startswith(
        "Make the collective at save_checkpoint (train.py:40) run on every"
    )
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in " ".join(verdict.next_steps)
    # an exit code of 0 says the same when the heartbeat does not; two ranks left, two wait
    verdict = classify(
        [
            rank(0, save),
            rank(1, None, exit_code=0),
            rank(2, save),
            rank(3, None, heartbeat_phase="finished"),
        ]
    )
    assert verdict.kind == "extra_collective"
    assert verdict.title.startswith("Extra collective on ranks 0, 2, reached after the peer left: barrier")
    assert "ranks 1, 3 finished and exited" in verdict.title


def test_a_peer_that_died_mid_step_is_still_rank_exited_not_same_collective():
    """The same barrier, but rank 1's heartbeat is in a working phase and its exit code is unknown
    (or not 0): it died before reaching the collective, so the exit is the cause."""
    save = in_collective("barrier", "save_checkpoint")
    for dead in (
        rank(1, None, heartbeat_phase="train"),
        rank(1, None, heartbeat_phase="finished", exit_code=-9),  # killed after its last heartbeat
        rank(1, None, exit_code=1),
    ):
        verdict = classify([rank(0, save), dead])
        assert verdict.kind == "rank_exited", dead
        assert verdict.title == "Rank 1 exited; rank 0 waits in barrier for it"
        assert not any(e.startswith("also fits") for e in verdict.evidence)
    # an exception beats a clean exit elsewhere: pattern A
    verdict = classify(
        [rank(0, save), rank(1, None, heartbeat_phase="finished"), rank(2, None, exception="ValueError: x")]
    )
    assert verdict.kind == "cleanup_deadlock" and "extra collective" not in " ".join(verdict.evidence)


def test_destroy_process_group_without_exception_is_teardown():
    destroy = in_collective("destroy_process_group", "shutdown_workers")
    verdict = classify([rank(0, destroy), rank(1, in_collective("recv_object_list", "run_stage"))])
    assert verdict.kind == "cleanup_deadlock"
    assert verdict.evidence[0].startswith("rank 0 in teardown without a recorded exception")
    assert verdict.rows[0].state == "teardown" and verdict.rows[1].collective == "recv_object_list"
    assert verdict.next_steps[0].startswith("Read the log of rank 0")


def test_every_rank_in_teardown_is_still_pattern_a():
    destroy = in_collective("destroy_process_group", "main")
    verdict = classify([rank(0, destroy), rank(1, destroy)])
    assert verdict.kind == "cleanup_deadlock"
    assert "no rank is left in the training loop" in verdict.title


def test_same_collective_from_different_call_sites_is_pattern_b():
    verdict = classify(
        [
            rank(0, in_collective("all_reduce", "forward", line=123)),
            rank(1, in_collective("all_reduce", "backward", line=456)),
            rank(2, in_collective("all_reduce", "forward", line=123)),
        ]
    )
    assert verdict.kind == "mismatched_collectives"
    assert any(
        "same collective (all_reduce) is called from different call sites" in e for e in verdict.evidence
    )
    assert any(
        e.startswith("rank 1 is missing the collective the others wait in (all_reduce ← forward")
        for e in verdict.evidence
    )


def test_every_rank_in_the_same_collective_points_at_the_oldest_heartbeat():
    stack = in_collective("all_reduce", "train_step")
    verdict = classify(
        [
            rank(0, stack, heartbeat_age_s=130.0),
            rank(1, stack, heartbeat_age_s=410.5, heartbeat_phase="train"),
            rank(2, stack, heartbeat_age_s=131.0),
        ]
    )
    assert verdict.kind == "same_collective" and verdict.pattern == "C"
    assert "every rank (ranks 0, 1, 2) waits in all_reduce" in verdict.title
    assert verdict.title.endswith("slowest heartbeat rank 1")
    assert "slowest heartbeat: rank 1, 410.5 s old, phase train" in verdict.evidence
    assert any("Start with rank 1" in step for step in verdict.next_steps)


def test_threads_beat_mismatch_but_a_plain_exit_beats_threads():
    grad = in_collective("all_reduce", "sync_gradients")
    metrics = in_collective("broadcast", "sync_metrics")
    two_threads = RankObservation(
        rank=0,
        pid=100,
        alive=True,
        stacks=(
            process(
                100,
                ("MainThread", (frame("join", "threading.py"),), False),
                ("a", grad, False),
                ("b", metrics, False),
            ),
        ),
    )
    other = rank(1, in_collective("barrier", "save"))
    assert classify([two_threads, other]).kind == "threads_same_group"
    dead = rank(2, None, exit_code=1)
    verdict = classify([two_threads, other, dead])
    assert verdict.kind == "rank_exited"
    assert verdict.evidence[-1] == "also fits: threads same group; mismatched collectives"


def test_all_gather_object_and_det_backend_frames_name_the_users_call():
    nested = (
        frame("all_gather", C10D, 10),
        frame("_exception_logger.<locals>.wrapper", LOGGER, 83),
        frame("all_gather_object", C10D, 20),
        frame("_exception_logger.<locals>.wrapper", LOGGER, 83),
        frame("collect_stats", "train.py", 7),
    )
    found = find_collective(ThreadStack(1, "MainThread", False, False, nested))
    assert found.name == "all_gather_object" and found.call_site.name == "collect_stats"
    det = (
        frame("DetProcessGroup._wait_all", "grpolab/core/det_backend.py", 243),
        frame("DetProcessGroup._share_slot", "grpolab/core/det_backend.py", 290),
        frame("DetProcessGroup.allreduce", "grpolab/core/det_backend.py", 355),
        frame("all_reduce", C10D, 3252),
        frame("_exception_logger.<locals>.wrapper", LOGGER, 83),
        frame("train_step", "grpolab/core/actor.py", 88),
    )
    found = find_collective(ThreadStack(1, "MainThread", False, False, det))
    assert found.name == "all_reduce" and found.call_site.name == "train_step"
    alone = find_collective(ThreadStack(1, "MainThread", False, False, det[:3] + det[5:]))
    assert alone.name == "all_reduce" and alone.entry.name == "DetProcessGroup.allreduce"
    # a function called all_reduce in the user's own code is not torch.distributed
    assert find_collective(ThreadStack(1, "M", False, False, (frame("all_reduce", "mylib/comm.py"),))) is None


def test_library_frames_are_skipped_in_where():
    waiting = (
        frame("Condition.wait", "threading.py", 320),
        frame("Queue.get", "queue.py", 171),
        frame("_worker", "concurrent/futures/thread.py", 81),
        frame("fetch_batch", "code/loader.py", 55),
        frame("main", "code/train.py", 9),
    )
    verdict = classify([rank(0, waiting), rank(1, waiting)])
    assert verdict.kind == "python_stall"
    assert verdict.rows[0].where == "fetch_batch (code/loader.py:55) ← main (code/train.py:9)"
    assert "every rank is idle" in verdict.title
    assert is_library_frame(frame("x", "/usr/lib/python3.11/site-packages/torch/nn/module.py"))
    assert not is_library_frame(frame("x", "code/train.py"))


def test_busy_worker_thread_is_reported_over_an_idle_main_thread():
    busy = (frame("tokenize_all", "data.py", 12), frame("Thread.run", "threading.py", 982))
    obs = RankObservation(
        rank=0,
        pid=5,
        alive=True,
        stacks=(process(5, ("MainThread", (frame("main", "train.py"),), False), ("tokenizer", busy, True)),),
    )
    verdict = classify([obs])
    assert verdict.kind == "python_stall"
    assert verdict.rows[0].thread == "tokenizer" and verdict.rows[0].state == "python"
    assert "rank 0 thread tokenizer is busy in tokenize_all (data.py:12)" in verdict.title


def test_changed_samples_are_reported():
    first = process(
        5, ("MainThread", (frame("loop", "train.py", 10), frame("<module>", "train.py", 1)), True)
    )
    second = process(
        5, ("MainThread", (frame("loop", "train.py", 11), frame("<module>", "train.py", 1)), True)
    )
    verdict = classify([RankObservation(rank=0, pid=5, alive=True, stacks=(first, second))])
    assert verdict.rows[0].unchanged is False
    assert "stacks changed between the two samples on rank 0 (still running code)" in verdict.evidence


def test_no_stack_rows_and_all_dead():
    mixed = classify([rank(0, in_collective("all_reduce", "step")), rank(1, None, alive=True)])
    assert mixed.rows[1].state == "no stack"
    assert "no stack could be read for rank 1 (alive, py-spy gave nothing)" in mixed.evidence
    gone = classify([rank(0, None, exit_code=0), rank(1, None, exit_code=0)])
    assert gone.kind == "rank_exited" and gone.title.startswith("No rank process is alive")


@pytest.mark.parametrize(
    ("observed", "message"),
    [
        ([], "at least one rank"),
        ([RankObservation(0, 1, True, ()), RankObservation(0, 2, True, ())], "more than once"),
        ([RankObservation(0, 1, True, ()), RankObservation(1, 2, True, ())], "nothing to classify"),
    ],
)
def test_bad_input_raises(observed, message):
    with pytest.raises(ValueError, match=message):
        classify(observed)


# ------------------------------------------------------------------------ ranks that were not inspected
def remote(r: int, host: str = "otherhost", **kwargs) -> RankObservation:
    """A rank on another host: its rank file says alive, but nothing of its process was seen."""
    return RankObservation(rank=r, pid=999990 + r, alive=True, stacks=(), remote_host=host, **kwargs)


def test_rank_not_inspected_is_not_counted_alive_in_a_collective_or_agreeing():
    reduce = in_collective("all_reduce", "train_step")
    verdict = classify([rank(0, reduce), remote(1), rank(2, reduce)])
    assert verdict.kind == "same_collective"
    assert verdict.title.startswith(
        "Same collective (pattern C): ranks 0, 2 wait in all_reduce ← train_step ("
    )
    assert verdict.title.endswith("(rank 1 not inspected: run this on otherhost too)")
    assert "every rank" not in verdict.title
    assert verdict.next_steps[0].startswith(
        "Run the same `grpolab diagnose hang` on otherhost too: rank 1 runs"
    )
    steps = " ".join(verdict.next_steps)
    assert "The code agrees on ranks 0, 2 (the ranks whose stacks were read)" in steps
    assert "every rank" not in steps
    evidence = " | ".join(verdict.evidence)
    assert "rank 1 on host otherhost was not inspected" in evidence and "2 of 3 ranks inspected" in evidence
    assert "py-spy gave nothing" not in evidence and "alive" not in evidence
    assert verdict.rows[1].state == "not inspected" and verdict.rows[1].where == "on host otherhost"
    assert "1     999991  not inspected  -          on host otherhost" in render_table(verdict)


def test_every_rank_wording_when_every_rank_was_inspected():
    reduce = in_collective("all_reduce", "train_step")
    verdict = classify([rank(0, reduce), rank(1, reduce)])
    assert "every rank (ranks 0, 1) waits in all_reduce" in verdict.title
    assert "not inspected" not in verdict.title
    assert any(s.startswith("The code agrees on every rank;") for s in verdict.next_steps)


def test_exited_rank_next_to_a_rank_not_inspected_is_not_the_end_of_the_run():
    verdict = classify([rank(0, None, exit_code=-9), remote(1, host="node-b")])
    assert verdict.kind == "rank_exited"
    assert verdict.title == "Rank 0 exited (rank 1 not inspected: run this on node-b too)"
    assert "No rank process is alive" not in verdict.title


def test_teardown_next_to_a_rank_not_inspected_does_not_say_it_waits():
    destroy = in_collective("destroy_process_group", "close")
    verdict = classify([rank(0, destroy, exception="ValueError: bad reward"), remote(1)])
    assert verdict.kind == "cleanup_deadlock"
    assert verdict.title == (
        "Cleanup deadlock (pattern A): rank 0 failed (ValueError) and is stuck in teardown "
        "(rank 1 not inspected: run this on otherhost too)"
    )
    assert not any("rank 1 waits" in line for line in verdict.evidence)


def test_a_process_in_doubt_is_named_in_title_evidence_and_first_step():
    reduce = in_collective("all_reduce", "train_step")
    sleeping = (frame("fork_socket_keeper", "job.py", 95), frame("<module>", "job.py", 1))
    doubt = "only an orphaned process matches RANK 1 (pid 101, parent pid 1): it may be a forked worker"
    verdict = classify([rank(0, reduce), rank(1, sleeping, caveat=doubt)])
    assert verdict.title.endswith("(rank 1's process is in doubt: see the evidence)")
    assert f"rank 1 (pid 101): {doubt}" in verdict.evidence
    assert verdict.next_steps[0].startswith("Check whether rank 1 still runs: pid 101 is the only process")


def test_a_thread_without_a_name_is_named_by_its_id():
    spinning = (frame("score", "job.py", 20), frame("<module>", "job.py", 1))
    stack = process(100, (None, spinning, True))
    verdict = classify([RankObservation(rank=0, pid=100, alive=True, stacks=(stack, stack))])
    assert verdict.kind == "python_stall"
    assert "rank 0 thread 100 is busy in score (job.py:20)" in verdict.title
    assert verdict.evidence[0] == "rank 0 thread 100 (active+gil): score (job.py:20) ← <module> (job.py:1)"
    assert "None" not in verdict.title + " ".join(verdict.evidence)
    assert verdict.rows[0].thread == "100"
