"""Config section of dynamic sampling (Miles' `--dynamic-sampling-filter-path` and over-sampling flags).

The string after each field is its documentation and the help text of its `grpolab train` flag.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpolab.core.config.validation import require


@dataclass(kw_only=True)
class DynamicSamplingConfig:
    """Which groups a rollout keeps: a filter over each scored group, refilled until enough are kept."""

    dynamic_sampling_filter_path: str | None = None
    """pkg.module.function deciding whether a scored group is trained, Miles' contract: `fn(args,
    samples, **kwargs)` returning `DynamicFilterOutput(keep, reason)` or a bool (grpolab.rollout.filters
    ships `check_reward_nonzero_std`, Miles' reward-variance filter, and `check_no_aborted`). Each round
    generates --over-sampling-batch-size prompts' groups; kept groups fill the rollout's
    --rollout-batch-size, dropped ones are counted by reason (`rollout/dynamic_filter/drop_<reason>`)."""
    over_sampling_batch_size: int | None = None
    """Prompts per generation round under --dynamic-sampling-filter-path (default --rollout-batch-size; at
    least that many): more candidates per round, fewer rounds."""
    max_refill_rounds: int = 10
    """Generation rounds a rollout may take to keep --rollout-batch-size groups; a filter that keeps too
    few for this many rounds ends the run (exit 1) with the rollout's ledger, instead of sampling forever."""

    def __post_init__(self) -> None:
        over = self.over_sampling_batch_size
        require(over is None or over >= 1, f"--over-sampling-batch-size must be >= 1, got {over}")
        require(
            over is None or self.dynamic_sampling_filter_path is not None,
            "--over-sampling-batch-size needs --dynamic-sampling-filter-path: without a filter every "
            "generated group is kept, so there is nothing to over-sample for",
        )
        require(
            self.max_refill_rounds >= 1, f"--max-refill-rounds must be >= 1, got {self.max_refill_rounds}"
        )

    @property
    def active(self) -> bool:
        """Whether rollouts filter their groups (a filter is named)."""
        return self.dynamic_sampling_filter_path is not None
