"""Miles-named metrics of one rollout, phase timers, the log-line format and the end-of-run summary.

Keys follow Miles (notes-miles-slime-areal.md section 4.3): trainer-side `rollout/*` token metrics
are per-sample masked means averaged over samples; `rollout/zero_std/count_<r>` counts groups whose
rewards are all equal, keyed by `str(round(r, 1))` with integral values printed as ints.
"""

from __future__ import annotations

import shlex
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from grpolab.core.batch import Sample
from grpolab.core.turns.episode import episode_counts


def _sample_mean(values: list[torch.Tensor], masks: list[torch.Tensor]) -> float:
    """Mean over samples of each sample's masked token mean (mask sum floored at 1)."""
    if not values:
        return 0.0
    per_sample = [float((v * m).sum() / m.sum().clamp(min=1)) for v, m in zip(values, masks)]
    return sum(per_sample) / len(per_sample)


def _reward_key(r: float) -> str:
    rounded = round(r, 1)
    return str(int(rounded)) if float(rounded).is_integer() else str(rounded)


def rollout_metrics(
    samples: list[Sample],
    *,
    log_probs: list[torch.Tensor] | None,
    ref_log_probs: list[torch.Tensor] | None,
    entropy: list[torch.Tensor] | None,
    rollout_id: int,
) -> dict[str, float]:
    """The `rollout N:` line: reward, length, truncation, zero-std groups and token-level means; for
    multi-turn samples also `rollout/num_turns`, `rollout/tool_calls` and `rollout/trainable_tokens`
    (means per sample) and `rollout/tool_parse_errors` (the rollout's count).

    Args:
        samples: the rollout's samples with rewards and advantages filled in.
        log_probs / ref_log_probs / entropy: per-sample float32 [R] trainer values before training
            (None under `--debug-rollout-only`, where no trainer exists).
    """
    masks = [s.loss_mask for s in samples]
    lengths = [s.response_length for s in samples]
    out: dict[str, float] = {
        "rollout/raw_reward": sum(s.reward for s in samples) / len(samples),
        "rollout/rewards": sum(s.advantage for s in samples) / len(samples),
        "rollout/advantages": _sample_mean(
            [torch.full_like(s.loss_mask, s.advantage) for s in samples], masks
        ),
        "rollout/response_lengths": sum(lengths) / len(lengths),
        "rollout/total_lengths": sum(len(s.prompt_ids) + s.response_length for s in samples) / len(samples),
        "rollout/truncated": sum(s.truncated for s in samples) / len(samples),
        "rollout/response_len/mean": sum(lengths) / len(lengths),
        "rollout/response_len/median": float(statistics.median(lengths)),
        "rollout/response_len/max": float(max(lengths)),
        "rollout/response_len/min": float(min(lengths)),
        "rollout/rollout_log_probs": _sample_mean([s.rollout_log_probs for s in samples], masks),
    }
    if log_probs is not None:
        out["rollout/log_probs"] = _sample_mean(log_probs, masks)
    if ref_log_probs is not None:
        out["rollout/ref_log_probs"] = _sample_mean(ref_log_probs, masks)
    if entropy is not None:
        out["rollout/entropy"] = _sample_mean(entropy, masks)
    groups: dict[int, list[float]] = {}
    for s in samples:
        groups.setdefault(s.group_index, []).append(s.reward)
    zero_std = Counter(_reward_key(rs[0]) for rs in groups.values() if len(set(rs)) == 1)
    for key, count in sorted(zero_std.items()):
        out[f"rollout/zero_std/count_{key}"] = float(count)
    n_groups = len(groups)
    out["rollout/zero_std/all_zero_percentage"] = zero_std.get("0", 0) / n_groups
    out["rollout/zero_std/all_one_percentage"] = zero_std.get("1", 0) / n_groups
    turns = episode_counts([s.metadata for s in samples])
    if turns:  # multi-turn samples (core/turns/episode.py): turns, tool calls, trainable tokens
        out.update(turns)
        out["rollout/trainable_tokens"] = sum(float(m.sum()) for m in masks) / len(samples)
    out["rollout/step"] = float(rollout_id)
    return out


class PhaseTimer:
    """Wall-clock seconds per named phase (`perf/<name>_time`), accumulated until `pop()`.

    Each phase is also a `grpolab/<name>` torch.profiler.record_function range, so that a
    `--use-pytorch-profiler` trace names every phase (monitor/profiler.py); without a running profiler
    the range costs a few microseconds (benchmarks/bench_profiler.py)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(f"grpolab/{name}"):
                yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        """`{"perf/<name>_time": seconds}` for every phase timed since the last pop."""
        out = {f"perf/{k}_time": v for k, v in self.seconds.items()}
        self.seconds = {}
        return out


def perf_metrics(
    phases: dict[str, float], *, step_seconds: float, engine_stats: dict[str, float] | None
) -> dict[str, float]:
    """The `perf N:` line: `phases` (`perf/<phase>_time`, seconds, from PhaseTimer.pop) plus
    `perf/train_time` (log-probs + reference log-probs + actor train, as Miles' train_time),
    `perf/step_time` (seconds) and, when the engine reports throughput and the step generated,
    `perf/rollout_tokens_per_sec` (generated tokens per second of the last generate call)."""
    perf = dict(phases)
    perf["perf/train_time"] = sum(
        perf.get(f"perf/{k}_time", 0.0) for k in ("log_probs", "ref_log_probs", "actor_train")
    )
    perf["perf/step_time"] = step_seconds
    if engine_stats is not None and "perf/rollout_time" in perf:
        perf["perf/rollout_tokens_per_sec"] = float(engine_stats.get("tokens_per_s", 0.0))
    return perf


def format_line(kind: str, index: int, metrics: dict[str, float]) -> str:
    """Miles' log line: `<kind> <index>: {python dict repr}` (single quotes, float reprs)."""
    return f"{kind} {index}: {dict(metrics)!r}"


def summary_row(
    rollout_id: int,
    num_rollout: int,
    rollout: dict[str, float],
    steps: list[dict[str, float]],
    perf: dict[str, float],
) -> str:
    """One compact human row per rollout, e.g. `[3/8] reward 0.42 len 11.2 trunc 0.00 kl 0.0012 gap 0.0001 step 1.9s`."""
    row = (
        f"[{rollout_id + 1}/{num_rollout}] reward {rollout['rollout/raw_reward']:.3f}"
        f" len {rollout['rollout/response_lengths']:.1f} trunc {rollout['rollout/truncated']:.2f}"
    )
    if steps:  # none under --debug-rollout-only: no trainer numbers to show
        last = steps[-1]
        row += (
            f" loss {last['train/loss']:+.4f} ppo_kl {last['train/ppo_kl']:.2e}"
            f" gap {last['train/train_rollout_logprob_abs_diff']:.2e} grad {last['train/grad_norm']:.3f}"
        )
    return row + f" step {perf.get('perf/step_time', 0.0):.2f}s"


def _duration(seconds: float) -> str:
    """`42 s`, `5 min 34 s`, `2 h 05 min`: a wall time for people."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class RunSummary:
    """What the end-of-run summary says: rollouts done by this process, wall time since the run
    object was built (loading included), the first and last `rollout/raw_reward` of them, and
    whether any optimizer step had a non-zero `train/grad_norm` (`untrained_warning`)."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self._clock = clock
        self.started = clock()
        self.rollout_ids: list[int] = []
        self.first_reward: float | None = None
        self.last_reward: float | None = None
        self.grad_norms: list[float] = []

    def add(self, rollout_id: int, rollout: dict[str, float], steps: Sequence[dict[str, float]] = ()) -> None:
        """Count one finished rollout; `rollout` is its `rollout N:` metrics, `steps` its `step N:` ones."""
        self.rollout_ids.append(rollout_id)
        self.grad_norms += [s["train/grad_norm"] for s in steps if "train/grad_norm" in s]
        reward = rollout.get("rollout/raw_reward")
        if reward is not None:
            self.first_reward = reward if self.first_reward is None else self.first_reward
            self.last_reward = reward

    def untrained_warning(self) -> str | None:
        """The end-of-run warning when every optimizer step of this process had `train/grad_norm` 0
        (the weights never moved), else None (also when no step ran: a rollout-only run)."""
        if not self.grad_norms or any(g != 0 for g in self.grad_norms):
            return None
        n = len(self.grad_norms)
        return (
            f"train/grad_norm was 0 at every optimizer step ({n} step{'' if n == 1 else 's'}): the weights "
            "never moved. A zero gradient means every advantage was 0 (groups of one sample, or every "
            "group's rewards equal: see rollout/zero_std/*) and no KL or entropy term pulled"
        )

    def lines(self, run_dir: str | Path, num_rollout: int) -> list[str]:
        """The summary, e.g. `done: 8 rollouts (0..7 of 8) in 5 min 34 s; reward 0.141 -> 0.484`,
        then the run directory and the command that opens it in the UI (the path shell-quoted, so
        that the command can be pasted as it is)."""
        n = len(self.rollout_ids)
        ids = (
            f"{self.rollout_ids[0]}..{self.rollout_ids[-1]}"
            if n > 1
            else f"{self.rollout_ids[0]}"
            if n
            else ""
        )
        head = f"done: {n} rollout{'' if n == 1 else 's'}"
        head += f" ({ids} of {num_rollout})" if n else ""
        head += f" in {_duration(self._clock() - self.started)}"
        if self.first_reward is not None and self.last_reward is not None:
            head += f"; reward {self.first_reward:.3f} -> {self.last_reward:.3f}"
        return [
            head,
            f"run directory: {run_dir}",
            f"open it in the UI: grpolab ui {shlex.quote(str(run_dir))}",
        ]
