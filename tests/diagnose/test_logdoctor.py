"""`grpolab diagnose log`: every rule on its fixture, silence on healthy logs, streaming edge cases.

Fixtures live in fixtures/logs (written by make_logs.py); large logs (a dead engine for 11 minutes)
are generated into tmp_path with the same module. Expected line numbers are computed here from the
text, independently of the doctor's chunked counting.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from grpolab.diagnose.common.dead_engine import WatchdogRule, error_times, replay_rule
from grpolab.diagnose.logdoctor import main
from grpolab.diagnose.logdoctor.model import RuleOptions, trim_line
from grpolab.diagnose.logdoctor.needles import NeedleFinder
from grpolab.diagnose.logdoctor.rules.metrics import metric_value
from grpolab.diagnose.logdoctor.ruleset import LogRules
from grpolab.diagnose.logdoctor.scan import scan_file

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "fixtures" / "logs"


def _make_logs():
    spec = importlib.util.spec_from_file_location("make_logs", LOGS / "make_logs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_logs = _make_logs()


def line_of(path: Path, text: str) -> int:
    """1-based number of the first line of `path` holding `text`."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def rules(scan) -> dict[str, object]:
    return {f.rule: f for f in scan.findings}


def as_json(scan) -> list[dict]:
    return [f.as_json() for f in scan.findings]


# (fixture, rule, severity, text of the evidence line, every rule the file must give)
CASES = [
    (
        "miles_dead_engine.log",
        "fa3_sm",
        "error",
        "FlashAttention v3 Backend requires",
        {"fa3_sm", "engine_503_bursts"},
    ),
    (
        "miles_reward_module.log",
        "reward_module_missing",
        "error",
        "No module named 'my_rewards'",
        {"reward_module_missing", "engine_503_bursts"},
    ),
    ("miles_ray_oom.log", "ray_oom", "error", "ray.exceptions.OutOfMemoryError", {"ray_oom"}),
    (
        "miles_attn_impl.log",
        "attn_implementation",
        "error",
        'attn_implementation="triton"',
        {"attn_implementation"},
    ),
    ("miles_engine_oom.log", "engine_oom_start", "error", "CUDA out of memory", {"engine_oom_start"}),
    ("miles_kv_tiny.log", "engine_oom_start", "warning", "#tokens: 3082", {"engine_oom_start"}),
    (
        "sglang_illegal_memory.log",
        "illegal_memory_access",
        "error",
        "illegal memory access",
        {"illegal_memory_access"},
    ),
    (
        "torchrun_inductor_cache.log",
        "inductor_cache",
        "error",
        "json.decoder.JSONDecodeError",
        {"inductor_cache"},
    ),
    (
        "miles_message_truncated.log",
        "nccl_weight_update",
        "error",
        "Message truncated : received",
        {"nccl_weight_update"},
    ),
    (
        "miles_segfault.log",
        "nccl_weight_update",
        "error",
        "Fatal Python error: Segmentation fault",
        {"nccl_weight_update"},
    ),
    (
        "torchrun_nccl_timeout_same.log",
        "nccl_watchdog_timeout",
        "error",
        "[Rank 0] Watchdog caught",
        {"nccl_watchdog_timeout"},
    ),
    (
        "torchrun_nccl_timeout_mismatch.log",
        "nccl_watchdog_timeout",
        "error",
        "[Rank 2] Watchdog caught",
        {"nccl_watchdog_timeout"},
    ),
    (
        "torchrun_nccl_timeout_behind.log",
        "nccl_watchdog_timeout",
        "error",
        "SeqNum=87",
        {"nccl_watchdog_timeout"},
    ),
    ("miles_step0_gap.log", "step0_gap", "error", "step 0: {", {"step0_gap"}),
    ("miles_kl_step0.log", "kl_nonzero_step0", "warning", "step 0: {", {"kl_nonzero_step0"}),
    ("miles_wandb_group.log", "wandb_group", "error", "'NoneType' and 'str'", {"wandb_group"}),
    ("grpolab_grad_nan.log", "grad_norm_nan", "error", "step 1: {", {"grad_norm_nan"}),
    ("grpolab_reward_nan.log", "reward_nonfinite", "error", "rollout 1: {", {"reward_nonfinite"}),
]
HEALTHY = [
    "miles_plain.log",
    "grpolab_console.log",
    "torchrun_healthy.log",
    "gate_seed1.log",
    "gate_candidate_ok.log",
]


def test_stored_fixtures_match_their_generator():
    for name, make in make_logs.DOCTOR_FIXTURES.items():
        assert (LOGS / name).read_text() == make(), f"{name} differs from make_logs.py; rerun it"
        assert (LOGS / name).stat().st_size < 64_000


@pytest.mark.parametrize(
    ("name", "rule", "severity", "evidence", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_rule_fires_on_its_fixture(name, rule, severity, evidence, expected):
    path = LOGS / name
    scan = scan_file(path, name=name)
    found = rules(scan)
    assert set(found) == expected, [f.title for f in scan.findings]
    finding = found[rule]
    assert finding.severity == severity
    lines = {e.line: e for e in finding.evidence}
    number = line_of(path, evidence)
    assert number in lines, (number, finding.evidence)
    assert lines[number].file == name
    raw = path.read_text().splitlines()[number - 1]
    assert lines[number].text.rstrip("…")[:60] in raw
    assert finding.cause and finding.fix and finding.source


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_logs_have_no_finding(name):
    scan = scan_file(LOGS / name)
    assert scan.findings == []
    assert scan.lines == len((LOGS / name).read_text().splitlines())


def test_real_grpolab_console_log_has_no_finding(tmp_path):
    from runs import run

    run_dir = run(tmp_path, "healthy", "--num-rollout", "2")
    console = run_dir / "console.log"
    assert "step 1: {" in console.read_text()
    scan = scan_file(console)
    assert scan.findings == [], [f.title for f in scan.findings]


def test_figures_of_the_findings():
    found = rules(scan_file(LOGS / "miles_ray_oom.log"))
    oom = found["ray_oom"]
    assert (oom.details["used_gb"], oom.details["total_gb"], oom.details["fraction"]) == (
        115.86,
        121.69,
        0.952127,
    )
    assert "115.86 GB of 121.69 GB" in oom.title and "172.17.0.3" in oom.title
    assert "no CUDA out-of-memory" in oom.cause

    attn = rules(scan_file(LOGS / "miles_attn_impl.log"))["attn_implementation"]
    assert attn.details["requested"] == "triton"
    assert {"eager", "sdpa", "flash_attention_2", "flex_attention"} <= set(attn.details["accepted"])

    module = rules(scan_file(LOGS / "miles_reward_module.log"))["reward_module_missing"]
    assert module.details["module"] == "my_rewards"
    assert module.details["custom_rm_path"] == "my_rewards.custom_rm"
    assert "--custom-rm-path my_rewards.custom_rm" in module.cause

    kv = rules(scan_file(LOGS / "miles_kv_tiny.log"))["engine_oom_start"]
    assert kv.details["kv_tokens"] == 3082
    gap = rules(scan_file(LOGS / "miles_step0_gap.log"))["step0_gap"]
    assert gap.details["gap"] == pytest.approx(0.3127)
    # the limit is a flag: above the gap, no finding
    assert "step0_gap" not in rules(
        scan_file(LOGS / "miles_step0_gap.log", options=RuleOptions(max_step0_gap=0.5))
    )

    grad = rules(scan_file(LOGS / "grpolab_grad_nan.log"))["grad_norm_nan"]
    assert grad.details["steps"] == [1, 2]
    assert "grad_norm_nan" not in rules(scan_file(LOGS / "grpolab_reward_nan.log"))

    segfault = rules(scan_file(LOGS / "miles_segfault.log"))["nccl_weight_update"]
    assert segfault.details["segfault"] and not segfault.details["truncated"]
    assert [e.line for e in segfault.evidence if e.note == "weight update"] == [
        line_of(LOGS / "miles_segfault.log", "Timer update_weights start")
    ]
    assert [e.line for e in segfault.evidence if not e.note] == [
        line_of(LOGS / "miles_segfault.log", "Fatal Python error"),
        line_of(LOGS / "miles_segfault.log", "(core dumped)"),
    ]


def test_nccl_watchdog_kinds_name_the_ranks():
    same = rules(scan_file(LOGS / "torchrun_nccl_timeout_same.log"))["nccl_watchdog_timeout"]
    assert same.details["kind"] == "same"
    assert "The same collective timed out on ranks 0, 1, 2, 3: SeqNum=1234 ALLREDUCE" in same.cause
    assert [r["rank"] for r in same.details["ranks"]] == [0, 1, 2, 3]

    mismatch = rules(scan_file(LOGS / "torchrun_nccl_timeout_mismatch.log"))["nccl_watchdog_timeout"]
    assert mismatch.details["kind"] == "mismatched"
    assert (
        "Mismatched collectives: at SeqNum=57 ranks 0, 1 run ALLREDUCE" in mismatch.cause
        and "ranks 2, 3 run BROADCAST" in mismatch.cause
    )

    behind = rules(scan_file(LOGS / "torchrun_nccl_timeout_behind.log"))["nccl_watchdog_timeout"]
    assert behind.details["kind"] == "behind"
    assert "Rank 3 behind" in behind.cause and "ranks 0, 1, 2 reached SeqNum=88" in behind.cause
    assert {r["rank"]: r["seq"] for r in behind.details["ranks"]} == {0: 88, 1: 88, 2: 88, 3: 87}


def test_nccl_hang_during_weight_sync(tmp_path):
    text = (LOGS / "torchrun_nccl_timeout_same.log").read_text().splitlines()
    text.insert(
        2,
        '[rank0]:  File "/root/miles/miles/backends/fsdp_utils/update_weight_utils.py", line 212, in '
        "update_weights_from_distributed",
    )
    path = tmp_path / "sync.log"
    path.write_text("\n".join(text) + "\n")
    finding = rules(scan_file(path))["nccl_watchdog_timeout"]
    assert finding.title.endswith("(during the weight sync)")
    assert finding.fix.startswith("NCCL hang during weight sync: raise the NCCL timeout")
    assert finding.details["weight_update_line"] == 3


# ---------------------------------------------------------------------- the dead-engine rule
def _per_line_replay(path: Path, rule: WatchdogRule):
    """The manual's rule replayed on every 503 line's own time (whole seconds), one float per line:
    (replay, number of 503 lines, first time)."""
    import re

    with open(path, encoding="utf-8") as f:
        times = error_times(f, re.compile("503 Service Unavailable")).times
    seconds = [float(math.floor(t)) for t in times]
    replay = replay_rule(seconds, rule, start=seconds[0], end=seconds[-1] + rule.window + rule.interval)
    return replay, len(times), seconds[0]


def test_dead_engine_flood_is_flagged(tmp_path):
    path = tmp_path / "dead.log"
    text = make_logs.dead_engine_flood(minutes=11, per_second=10)
    path.write_text(text)
    found = rules(scan_file(path))
    assert set(found) == {"dead_engine", "fa3_sm"}
    dead = found["dead_engine"]
    assert dead.severity == "error"
    assert dead.details["count"] == text.count("503 Service Unavailable") == 6600
    assert dead.details["first_time"] == "21:03:30" and dead.details["last_time"] == "21:14:30"
    # from the first error every check counts 300 (> 100): the 10th check, 300 s in, stops the run
    assert dead.details["stopped_after_s"] == 300
    # checks at 30, 60, …, 690 s all count more than 100 (the last one: seconds 631-660)
    assert dead.details["most_checks_in_a_row"] == 23
    slow, n, first = _per_line_replay(path, WatchdogRule())
    assert n == 6600 and slow.stopped_at - first == 300
    evidence = {e.note: e.line for e in dead.evidence}
    assert evidence["first 503"] == line_of(path, "503 Service Unavailable") == 5
    assert [e.line for e in dead.evidence if e.note == "above the first 503"] == [1, 2, 3, 4]
    assert "fa3_sm at line 3" in dead.cause
    assert found["fa3_sm"].evidence[0].line == 3


@pytest.mark.parametrize("chunk", [4096, 65536])
def test_bucket_counting_matches_a_per_line_replay(tmp_path, chunk):
    path = tmp_path / "dead.log"
    path.write_text(make_logs.dead_engine_flood(minutes=7, per_second=3))
    for checks, limit, interval, window in [
        (1, 150, 30, 60),
        (6, 150, 30, 60),
        (10, 150, 30, 60),
        (3, 40, 20, 50),
    ]:
        rule = WatchdogRule(checks=checks, limit=limit, interval=interval, window=window)
        slow, n, first = _per_line_replay(path, rule)
        found = rules(scan_file(path, chunk_bytes=chunk, options=RuleOptions(watchdog=rule)))
        finding = found.get("dead_engine") or found["engine_503_bursts"]
        assert finding.details["count"] == n == 7 * 60 * 3
        if slow.stopped_at is None:
            assert finding.rule == "engine_503_bursts", rule
            assert finding.details["most_checks_in_a_row"] == slow.most_in_a_row
        else:
            assert finding.rule == "dead_engine", rule
            assert finding.details["stopped_after_s"] == slow.stopped_at - first


@pytest.mark.parametrize(("interval", "window"), [(30, 60), (20, 50), (15, 15), (45, 60)])
def test_buckets_give_every_check_its_exact_count(interval, window):
    from grpolab.diagnose.common.dead_engine import count_in_window
    from grpolab.diagnose.logdoctor.rules.dead_engine import EngineErrors

    rnd = random.Random(interval * 100 + window)
    rule = WatchdogRule(interval=interval, window=window)
    seconds = sorted(
        1_760_000_000 + rnd.choice([rnd.randrange(600), rnd.randrange(200, 260)]) for _ in range(3000)
    )
    engine = EngineErrors(rule)
    engine.begin(b"[2025-10-09 08:53:20] 503")  # 1760000000
    for t in seconds:
        engine.add(engine.bucket(t), 1)
    times = engine.times()
    for t, n in engine.check_counts(times):
        assert n == count_in_window(seconds, t, window), t


def test_bursty_503_times_replay_like_the_per_line_rule(tmp_path):
    # random bursts whose per-window counts sit near the limit: a boundary second counted in the
    # wrong bucket changes a decision
    rnd = random.Random(11)
    t0 = datetime(2026, 10, 22, 7, 16, 29, 250000)
    lines, t = [], 0.0
    while t < 1800:
        burst = rnd.uniform(5, 70)
        rate = rnd.uniform(1.0, 4.0)
        for _ in range(int(burst * rate)):
            t += rnd.expovariate(rate)
            lines.append(
                make_logs.error_503(t0 + timedelta(seconds=t), rnd.choice(["miles", "ray", "sglang"]))
            )
        t += rnd.uniform(0, 50)
    path = tmp_path / "bursty.log"
    path.write_text("\n".join(lines) + "\n")
    decisions = set()
    for checks in (1, 2, 3, 4, 6):
        for limit in (60, 90, 120):
            rule = WatchdogRule(checks=checks, limit=limit)
            slow, n, first = _per_line_replay(path, rule)
            found = rules(scan_file(path, chunk_bytes=8192, options=RuleOptions(watchdog=rule)))
            finding = found.get("dead_engine") or found["engine_503_bursts"]
            assert finding.details["count"] == n
            decisions.add(slow.stopped_at is not None)
            if slow.stopped_at is None:
                assert (
                    finding.rule == "engine_503_bursts"
                    and finding.details["most_checks_in_a_row"] == slow.most_in_a_row
                )
            else:
                assert finding.details["stopped_after_s"] == slow.stopped_at - first, (checks, limit)
    assert decisions == {True, False}  # the cases cover both outcomes


def test_healthy_bursts_are_not_a_dead_engine():
    path = LOGS / "miles_503_bursts.log"
    scan = scan_file(path)
    assert set(rules(scan)) == {"engine_503_bursts"}
    bursts = rules(scan)["engine_503_bursts"]
    assert bursts.severity == "info"
    assert bursts.details["count"] == 260 > WatchdogRule().limit  # a count alone would flag it
    slow, _, _ = _per_line_replay(path, WatchdogRule())
    assert slow.stopped_at is None
    assert bursts.details["most_checks_in_a_row"] == slow.most_in_a_row == 1
    # the same log under a rule of one check is flagged: the time rule decides, not the count
    one = rules(scan_file(path, options=RuleOptions(watchdog=WatchdogRule(checks=1))))
    assert one["dead_engine"].severity == "error"
    slow, _, first = _per_line_replay(path, WatchdogRule(checks=1))
    assert one["dead_engine"].details["stopped_after_s"] == slow.stopped_at - first


def test_503_lines_without_time_are_counted_only(tmp_path):
    path = tmp_path / "bare.log"
    path.write_text(make_logs.bare_503_log(150))
    dead = rules(scan_file(path))["dead_engine"]
    assert dead.severity == "warning"
    assert dead.details == {"count": 150, "timed": False}
    assert "could not be applied" in dead.title


# ---------------------------------------------------------------------- streaming
@pytest.mark.parametrize("name", [c[0] for c in CASES] + ["miles_503_bursts.log", "miles_plain.log"])
def test_tiny_chunks_give_the_same_findings(name):
    path = LOGS / name
    reference = as_json(scan_file(path, name=name))
    for chunk in (1, 97, 4096):
        assert as_json(scan_file(path, name=name, chunk_bytes=chunk)) == reference, chunk


def test_tiny_chunks_on_a_dead_engine(tmp_path):
    path = tmp_path / "dead.log"
    path.write_text(make_logs.dead_engine_flood(minutes=11, per_second=10))
    reference = as_json(scan_file(path, name="dead.log"))
    for chunk in (333, 4096, 65536):
        assert as_json(scan_file(path, name="dead.log", chunk_bytes=chunk)) == reference, chunk


def test_line_numbers_after_chunks_without_needles(tmp_path):
    # needle-free chunks are not counted until a later line needs its number (read again from disk)
    rnd = random.Random(3)
    filler = [
        f"[2026-10-17 16:{i // 60 % 60:02d}:{i % 60:02d}] worker {rnd.randrange(9)} idle"
        for i in range(20000)
    ]
    long_line = "x" * 100_000 + " CUDA error: an illegal memory access was encountered"
    lines = (
        filler[:7000] + ["RuntimeError: CUDA error: an illegal memory access was encountered"] + filler[7000:]
    )
    lines += [long_line, "ModuleNotFoundError: No module named 'late_module'"]
    path = tmp_path / "late.log"
    path.write_text("\n".join(lines))  # no newline after the last line
    for chunk in (4096, 1 << 20):
        scan = scan_file(path, chunk_bytes=chunk)
        illegal = rules(scan)["illegal_memory_access"]
        assert [e.line for e in illegal.evidence] == [7001, 20002]
        assert rules(scan)["reward_module_missing"].evidence[0].line == 20003
        assert scan.lines == 20003


def test_needle_finder_finds_every_occurrence():
    needles = list(LogRules("x.log").needles)
    rnd = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .:'{}`<>=_-/[]()\n"
    for trial in range(30):
        # some texts are full of the anchor bytes, so anchors overflow and fall back to direct search
        weights = [rnd.random() ** 4 for _ in alphabet]
        pieces = []
        for _ in range(400):
            if rnd.random() < 0.1:
                pieces.append(rnd.choice(needles).decode())
            else:
                pieces.append("".join(rnd.choices(alphabet, weights, k=rnd.randint(1, 60))))
        text = "".join(pieces).encode() + b"\n"
        finder = NeedleFinder(needles)
        buf = bytearray(text)
        got = sorted(finder.find_all(buf, len(buf)))
        want = sorted(
            (i, k) for k, needle in enumerate(needles) for i in range(len(text)) if text.startswith(needle, i)
        )
        assert got == want, trial


def test_rules_are_registered_by_id():
    from grpolab.diagnose.logdoctor.model import RULES, Rule, register

    assert set(RULES.names()) == {
        "reward_module_missing",
        "fa3_sm",
        "ray_oom",
        "attn_implementation",
        "engine_oom_start",
        "cuda_oom",
        "illegal_memory_access",
        "inductor_cache",
        "nccl_weight_update",
        "segfault",
        "nccl_watchdog_timeout",
        "step0_gap",
        "kl_nonzero_step0",
        "grad_norm_nan",
        "reward_nonfinite",
        "wandb_group",
        "dead_engine",
        "engine_503_bursts",
        "fault_injected",
        "engine_dead_timeout",
        "engine_gone",
        "train_failed",
        "rank_error",
        "router_engine_errors",
    }
    again = type("Again", (Rule,), {"id": "fa3_sm", "severity": "error", "source": "x"})
    with pytest.raises(ValueError, match="'fa3_sm' is already registered"):
        register(again)
    with pytest.raises(ValueError, match="unknown log doctor rule 'fa3'; valid: .*fa3_sm"):
        RULES.get("fa3")
    split = type("Split", (Rule,), {"id": "split", "severity": "error", "needles": (b"a\nb",)})
    with pytest.raises(ValueError, match="plain ASCII without a newline"):
        register(split)
    blind = type("Blind", (Rule,), {"id": "blind", "severity": "error", "needles": (b"boom",)})
    with pytest.raises(ValueError, match="has needles but no observe"):
        register(blind)
    assert "split" not in RULES.names() and "blind" not in RULES.names()
    with pytest.raises(
        ValueError, match="is not a registered rule; registered: attn_implementation, cuda_oom"
    ):
        LogRules("x.log").rule(again)
    # the scanner looks for the needles of the registered rules, each once
    needles = LogRules("x.log").needles
    assert len(set(needles)) == len(needles)
    assert {n for kind in RULES.values() for n in kind.needles} <= set(needles)


def test_context_is_required():
    # a TypeError without wandb, a JSONDecodeError without inductor, a segfault without a weight update
    rules_ = LogRules("x.log")
    rules_.on_line(
        [b"'NoneType' and 'str'"], 3, "TypeError: unsupported operand type(s) for +: 'NoneType' and 'str'"
    )
    rules_.on_line(
        [b"JSONDecodeError"], 9, "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    )
    rules_.on_line([b"Segmentation fault"], 20, "Segmentation fault (core dumped)")
    rules_.on_line(
        [b"SIGSEGV"],
        30,
        "(raylet) The worker died. There are some potential root causes. (3) The worker is crashed unexpectedly due "
        "to SIGSEGV or other unexpected errors.",
    )
    assert rules_.wants_context() == [3, 9, 20]
    rules_.add_context([(1, "import os"), (2, "train()"), (4, "import json")])
    found = {f.rule: f for f in rules_.finish()}
    assert set(found) == {"segfault"}
    assert [e.line for e in found["segfault"].evidence] == [20]


def test_module_error_followed_by_rollouts_is_not_flagged():
    rules_ = LogRules("x.log")
    rules_.on_line([b"ModuleNotFoundError"], 2, "ModuleNotFoundError: No module named 'flash_attn'")
    rules_.on_line([b": {'"], 9, "rollout 0: {'rollout/raw_reward': 0.5, 'rollout/step': 0}")
    assert rules_.finish() == []
    # the same error after the last rollout line is flagged
    rules_.on_line([b"ModuleNotFoundError"], 12, "ModuleNotFoundError: No module named 'my_rewards'")
    (finding,) = rules_.finish()
    assert finding.rule == "reward_module_missing" and finding.details["module"] == "my_rewards"
    assert [e.line for e in finding.evidence] == [12] and "rollouts ran before it" in finding.title


def test_cuda_oom_after_the_first_rollout_is_not_an_engine_start_problem():
    rules_ = LogRules("x.log")
    rules_.on_line([b": {'"], 4, "rollout 0: {'rollout/raw_reward': 0.5, 'rollout/step': 0}")
    rules_.on_line(
        [b"CUDA out of memory"], 30, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    )
    (finding,) = rules_.finish()
    assert (finding.rule, finding.severity, finding.evidence[0].line) == ("cuda_oom", "error", 30)


def test_ray_kill_message_over_several_lines(tmp_path):
    # Ray's usual layout: the OutOfMemoryError, the memory figures and the raylet's hint on separate
    # lines, with Ray's colour codes around the actor prefixes
    path = tmp_path / "ray.log"
    path.write_text(
        "\x1b[36m(FSDPTrainRayActor pid=88)\x1b[0m step running\n"
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "Memory on the node (IP: 10.0.62.231, ID: e5d953ef03e5) where the task (task ID: ffff, name=train, pid=88, "
        "memory used=30.10GB) was running was 32.91GB / 33.28GB (0.988698), which exceeds the memory usage "
        "threshold of 0.95.\n"
        "\x1b[33m(raylet)\x1b[0m Refer to the documentation on how to address the out of memory issue. To adjust "
        "the kill threshold, set the environment variable `RAY_memory_usage_threshold` when starting Ray.\n"
    )
    oom = rules(scan_file(path))["ray_oom"]
    assert (oom.details["used_gb"], oom.details["total_gb"], oom.details["node_ip"]) == (
        32.91,
        33.28,
        "10.0.62.231",
    )
    assert [e.line for e in oom.evidence] == [2, 3]
    assert all("\x1b" not in e.text for e in oom.evidence)


def test_colour_codes_do_not_hide_503_times(tmp_path):
    text = make_logs.dead_engine_flood(minutes=6, per_second=5, styles=("ray",))
    path = tmp_path / "colour.log"
    path.write_text(text.replace("(RolloutManager pid=2549)", "\x1b[36m(RolloutManager pid=2549)\x1b[0m"))
    dead = rules(scan_file(path))["dead_engine"]
    assert dead.details["count"] == 6 * 60 * 5 and dead.details["timed"]
    assert "\x1b" not in dead.evidence[-1].text


def test_metric_values_and_trimming():
    assert metric_value("nan") != metric_value("nan")  # nan
    assert metric_value("np.float64(-inf)") == -math.inf
    assert metric_value("tensor(0.25)") == 0.25
    assert metric_value("'text'") is None
    long = "step 0: {" + ", ".join(f"'train/k{i}': {i}.0" for i in range(80)) + ", 'train/grad_norm': nan}"
    cut = trim_line(long, "'train/grad_norm'")
    assert "'train/grad_norm': nan" in cut and len(cut) <= 250


# ---------------------------------------------------------------------- CLI
def test_cli_exit_codes_and_json(tmp_path, capsys):
    assert main([str(LOGS / "miles_plain.log")]) == 0
    out = capsys.readouterr().out
    assert "no known failure signature" in out and out.strip().splitlines()[-1].startswith(
        "scanned 1 file, 26.5 kB in"
    )

    assert main([str(LOGS / "miles_503_bursts.log")]) == 0  # info only
    capsys.readouterr()
    assert main([str(LOGS / "miles_ray_oom.log")]) == 1
    assert "ERROR   ray_oom: Ray killed a worker" in capsys.readouterr().out

    missing = tmp_path / "missing.log"
    assert main([str(LOGS / "miles_ray_oom.log"), str(missing)]) == 2
    captured = capsys.readouterr()
    assert f"cannot read {missing}" in captured.err and "ray_oom" in captured.out
    assert main([str(tmp_path)]) == 2  # a directory that is not a run directory (no console.log)
    assert "a directory without console.log" in capsys.readouterr().err

    files = [str(LOGS / "miles_dead_engine.log"), str(LOGS / "grpolab_console.log")]
    assert main(["--json", *files]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == 1
    assert [f["file"] for f in report["files"]] == files
    first = report["files"][0]
    assert set(first) == {"file", "bytes", "lines", "seconds", "mb_per_s", "error", "findings"}
    assert first["bytes"] == (LOGS / "miles_dead_engine.log").stat().st_size and first["lines"] == 6
    finding = first["findings"][0]
    assert set(finding) == {"rule", "severity", "title", "evidence", "cause", "fix", "source", "details"}
    assert finding["rule"] == "fa3_sm" and finding["evidence"][0] == {
        "file": files[0],
        "line": 3,
        "text": (LOGS / "miles_dead_engine.log").read_text().splitlines()[2],
        "note": "",
    }
    assert report["files"][1]["findings"] == []
    summary = report["summary"]
    assert (summary["files"], summary["unreadable"], summary["error"], summary["info"]) == (2, 0, 1, 1)
    assert summary["text"].startswith("scanned 2 files")


def test_cli_rejects_bad_options(capsys):
    assert main(["--checks", "0", str(LOGS / "miles_plain.log")]) == 2
    assert "--checks must be" in capsys.readouterr().err
    assert main(["--chunk-bytes", "0", str(LOGS / "miles_plain.log")]) == 2
    assert "--chunk-bytes" in capsys.readouterr().err
    with pytest.raises(ValueError, match="whole number of seconds"):
        RuleOptions(watchdog=WatchdogRule(interval=30.5))


def test_grpolab_diagnose_log_command(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "grpolab", "diagnose", "log", str(LOGS / "miles_kv_tiny.log")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING engine_oom_start: tiny KV cache: 3,082 tokens" in proc.stdout


def test_doctor_does_not_import_torch():
    code = "import sys, grpolab.diagnose.logdoctor; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
    ("tail", "said", "fix"),
    [
        ("; --max-engine-restarts 1: none left", "none left: --max-engine-restarts 1 used", "raise --max-engine-restarts"),
        ("; its restart failed: engine 0 restarted at http://127.0.0.1:7 reports weight version default, the "
         "trainer's is 3: not registered", "restart failed: engine 0 restarted", "a refused check names"),
        ("", None, "with --use-fault-tolerance it restarts an engine that exits"),
    ],
)  # fmt: skip
def test_engine_gone_says_what_fault_tolerance_did(
    tmp_path: Path, tail: str, said: str | None, fix: str
) -> None:
    console = tmp_path / "console.log"
    console.write_text(
        "grpolab train: error: EngineDeadError: rollout engine 'sglang fleet (1 engine behind "
        "http://127.0.0.1:5)' is gone: engine 0 (http://127.0.0.1:6) exited (killed by SIGKILL)"
        f"{tail} (during generate; it cannot come back)\n"
    )
    found = rules(scan_file(console))["engine_gone"]
    ft = found.details["fault_tolerance"]
    assert ft is None if said is None else said in ft, ft
    assert fix in found.fix, found.fix
