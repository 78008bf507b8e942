"""Config sections for debugging a run: cutting the loop in half, and the in-run CI checkers.

The string after each field is its documentation and the help text of its `grpolab train` flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpolab.core.config.validation import require, run_value_checks

MILES_ENTROPY_RANGE = (0.0, 0.7)
"""Miles' `--ci-test` range for rollout/entropy in nats (log_utils.py, reference/miles-debugging.md)."""


@dataclass(kw_only=True)
class DebugConfig:
    """Cut the loop in half (Miles debugging page): rollout-only capture, train-only replay, inject."""

    debug_rollout_only: bool = False
    """Generation only; the trainer's optimizer and backward are never built."""
    debug_train_only: bool = False
    """Training only; no engine is built (implied by --load-debug-rollout-data)."""
    save_debug_rollout_data: str | None = None
    """Record every rollout to this path template (must contain {rollout_id}; evals go to eval_<id>)."""
    overwrite_debug_rollout_data: bool = False
    """Let --save-debug-rollout-data replace recordings another run made (refused by default)."""
    load_debug_rollout_data: str | None = None
    """Train from these recordings instead of generating (implies --debug-train-only)."""
    load_debug_rollout_data_subsample: float | None = None
    """Keep about this fraction of each recording's samples, in (0, 1]."""
    allow_recording_mismatch: bool = False
    """Replay recordings made with another model/tokenizer/config."""
    ci_inject_rollout_data_path: str | None = None
    """Generate, compare with this recording (path template with {rollout_id}), train on the recording."""
    ci_inject_rollout_data_start_rollout_id: int = 0
    """First rollout to inject."""
    ci_inject_rollout_data_min_match_ratio: float = 0.9
    """The mean response-token match ratio must be strictly greater than this (Miles default 0.9)."""
    debug_skip_weight_update: bool = False
    """Keep the offload/onload schedule but do not send weights."""
    debug_disable_optimizer: bool = False
    """No optimizer or scheduler step; forward and backward still run."""
    debug_exit_after_rollout: int | None = None
    """Stop after this rollout id."""
    save_debug_event_data: str | None = None
    """Also write the run's events.jsonl into this directory."""

    def __post_init__(self) -> None:
        if self.load_debug_rollout_data is not None:
            self.debug_train_only = True
        require(
            not (self.debug_rollout_only and self.debug_train_only),
            "--debug-rollout-only and --debug-train-only (or --load-debug-rollout-data) exclude each other: "
            "one generates without training, the other trains without generating",
        )
        run_value_checks(self)  # the recording path templates (replay/paths.py)
        if self.ci_inject_rollout_data_path is not None:
            require(
                not self.debug_train_only,
                "--ci-inject-rollout-data-path needs engines; it excludes --debug-train-only/--load-debug-rollout-data",
            )
            require(
                not self.debug_rollout_only,
                "--ci-inject-rollout-data-path trains on the recording; it excludes --debug-rollout-only",
            )
        self._check_ranges()

    def _check_ranges(self) -> None:
        require(
            self.ci_inject_rollout_data_start_rollout_id >= 0,
            "--ci-inject-rollout-data-start-rollout-id must be >= 0",
        )
        require(
            0 <= self.ci_inject_rollout_data_min_match_ratio <= 1,
            "--ci-inject-rollout-data-min-match-ratio must be in [0, 1]",
        )
        require(
            self.load_debug_rollout_data_subsample is None or 0 < self.load_debug_rollout_data_subsample <= 1,
            f"--load-debug-rollout-data-subsample must be in (0, 1], got {self.load_debug_rollout_data_subsample}",
        )
        require(
            self.load_debug_rollout_data_subsample is None or self.load_debug_rollout_data is not None,
            "--load-debug-rollout-data-subsample needs --load-debug-rollout-data",
        )
        require(
            not self.overwrite_debug_rollout_data or self.save_debug_rollout_data is not None,
            "--overwrite-debug-rollout-data needs --save-debug-rollout-data",
        )
        require(
            self.debug_exit_after_rollout is None or self.debug_exit_after_rollout >= 0,
            "--debug-exit-after-rollout must be >= 0",
        )


@dataclass(kw_only=True)
class CIConfig:
    """In-run checkers (--ci-test) and their escape hatches (Miles debugging page, manual 5.2/8.3)."""

    ci_test: bool = False
    """In-run invariant checkers (KL, log-probs, weight update)."""
    ci_disable_kl_checker: bool = False
    """Escape hatch for the KL checker."""
    ci_disable_logprobs_checker: bool = False
    """Escape hatch for the log-prob checker."""
    ci_logprobs_checker_abs_tol: float = 0.03
    """Trainer-vs-engine mean log-prob gap tolerance."""
    ci_entropy_range: list[float] = field(
        default_factory=lambda: list(MILES_ENTROPY_RANGE), metadata={"metavar": ("LOW", "HIGH")}
    )
    """Two values LOW HIGH: the log-prob checker fails when rollout/entropy (nats per token) is not
    strictly inside (default: 0 0.7, the range Miles' --ci-test asserts on the runs of its CI
    models). Uniform noise is ln(vocab size) nats (10.8 for a 49k vocabulary): another model, raw
    prompts or open-ended answers can sit well above 0.7 without being noise."""
    ci_disable_weight_update_checker: bool = False
    """Escape hatch for the weight-update checker."""
    check_weight_update_equal: bool = False
    """Run the weight-update checker even without --ci-test."""
    ci_metric_checker_key: str | None = None
    """Eval metric to gate on, e.g. eval/arith (needs --ci-metric-checker-threshold)."""
    ci_metric_checker_threshold: float | None = None
    """The --ci-metric-checker-key metric must reach this."""
    ci_metric_checker_expect_num: int | None = None
    """Exactly this many passing evals."""
    ci_save_grad_norm: str | None = None
    """Path template with {role}, {rollout_id}, {step_id}: write each step's grad norm there."""
    ci_load_grad_norm: str | None = None
    """Path template: compare each step's grad norm with the saved one (tolerance --ci-grad-norm-rtol)."""
    ci_grad_norm_rtol: float = 0.03
    """Relative and absolute tolerance of the grad-norm comparison (0 = bitwise)."""
    ci_save_model_hash: bool = False
    """Write per-layer SHA-256 hashes next to every checkpoint."""
    ci_check_model_hash: bool = False
    """After --load, recompute the per-layer hashes and compare with the saved ones."""
    save_model_hash_every_step: bool = False
    """After every optimizer step, write each parameter's SHA-256 to RUN_DIR/checks/model_hash_step_<N>.json
    (`grpolab diff` names the first parameter that differs; rank 0's shard on several ranks)."""
    ci_max_abs_advantage: float = 10.0
    """Numeric guard: the largest allowed |advantage|."""
    ci_ft_test_actions: str | None = None
    """JSON list of fault-injection actions, e.g. '[{"at_rollout": 2, "action": "raise_in_train", "rank": 0}]'."""

    @property
    def kl_checker_on(self) -> bool:
        """The KL checker runs: --ci-test without --ci-disable-kl-checker."""
        return self.ci_test and not self.ci_disable_kl_checker

    @property
    def logprobs_checker_on(self) -> bool:
        """The log-prob checker runs: --ci-test without --ci-disable-logprobs-checker."""
        return self.ci_test and not self.ci_disable_logprobs_checker

    def __post_init__(self) -> None:
        require(self.ci_logprobs_checker_abs_tol >= 0, "--ci-logprobs-checker-abs-tol must be >= 0")
        require(
            len(self.ci_entropy_range) == 2 and 0 <= self.ci_entropy_range[0] < self.ci_entropy_range[1],
            f"--ci-entropy-range takes two values LOW HIGH with 0 <= LOW < HIGH (nats), got {self.ci_entropy_range}",
        )
        require(self.ci_grad_norm_rtol >= 0, "--ci-grad-norm-rtol must be >= 0")
        require(self.ci_max_abs_advantage > 0, "--ci-max-abs-advantage must be > 0")
        require(
            (self.ci_metric_checker_key is None) == (self.ci_metric_checker_threshold is None),
            "--ci-metric-checker-key and --ci-metric-checker-threshold go together",
        )
        require(
            self.ci_metric_checker_expect_num is None or self.ci_metric_checker_key is not None,
            "--ci-metric-checker-expect-num needs --ci-metric-checker-key",
        )
        run_value_checks(
            self
        )  # grad-norm templates (checkers/grad_norm.py), the faults table (checkers/faults.py)
