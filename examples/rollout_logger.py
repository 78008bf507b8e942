"""A custom rollout logger for `grpolab train --custom-rollout-log-function-path
grpolab.examples.rollout_logger.log_rollout`: Miles' `fn(rollout_id, args, samples, extra,
rollout_time) -> bool` contract (Miles monitoring manual, "custom rollout logging"; our side:
`monitor/custom_logger.py`).

It prints one line per rollout, the numbers read from the rollout's own samples and metrics
(nothing is invented): how many samples, their mean reward, how many groups had every answer
rewarded the same (a zero-std group teaches nothing), the longest response in tokens and the
generation time. It returns False, so the default `rollout N: {...}` line and the wandb /
TensorBoard rollout scalars stay; return True from your own logger to replace them.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from grpolab.core.batch import Sample


def log_rollout(
    rollout_id: int,
    args: argparse.Namespace,
    samples: Sequence[Sample],
    extra: dict[str, Any],
    rollout_time: float,
) -> bool:
    """Print `custom logger: rollout N: 64 samples, mean reward 0.484, 2/8 groups zero-std,
    longest response 32 tokens (--rollout-max-response-len 32), generated in 1.93 s`.

    Args:
        rollout_id: the rollout's id (0-based).
        args: one attribute per `grpolab train` flag (`args.rollout_max_response_len`).
        samples: the whole rollout (rank 0 gathers it), rewards and advantages filled.
        extra: {"metrics": the rollout's metrics.jsonl record's metrics, "run_dir": str}.
        rollout_time: generation seconds (`perf/rollout_time`; 0.0 for a replayed rollout).

    Returns:
        False: keep the default rollout logging.
    """
    groups: dict[int, set[float]] = defaultdict(set)
    for s in samples:
        groups[s.group_index].add(float(s.reward))
    flat = sum(len(rewards) == 1 for rewards in groups.values())
    mean = sum(float(s.reward) for s in samples) / max(len(samples), 1)
    longest = max((s.response_length for s in samples), default=0)
    print(
        f"custom logger: rollout {rollout_id}: {len(samples)} samples, mean reward {mean:.3f}, "
        f"{flat}/{len(groups)} groups zero-std, longest response {longest} tokens "
        f"(--rollout-max-response-len {args.rollout_max_response_len}), generated in {rollout_time:.2f} s",
        flush=True,
    )
    return False
