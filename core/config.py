"""Run configuration: one keyword-only dataclass per component, validated on construction.

Field names follow Miles flags (`--rollout-batch-size` -> `rollout_batch_size`). Every check
raises ValueError naming the flag and what was expected. `Config.to_dict()` is what `run.json`
stores as the resolved config.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"
DEFAULT_CHECKPOINT = FIXTURES_DIR / "tiny-qwen3"
DEFAULT_PROMPT_DATA = FIXTURES_DIR / "data" / "arithmetic_train.jsonl"
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")
DTYPE_NAMES = ("float32", "bfloat16")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(kw_only=True)
class ModelConfig:
    """Which weights to load and in which precision."""

    hf_checkpoint: str = str(DEFAULT_CHECKPOINT)
    """`--hf-checkpoint`: model directory (save_pretrained layout) or a .gguf file."""
    rollout_dtype: str = "float32"
    """`--rollout-dtype`: engine parameter dtype."""
    train_dtype: str = "float32"
    """`--train-dtype`: trainer parameter dtype (log-probs are always computed in float32)."""
    device: str = "cpu"
    """`--device`: "cpu" or "cuda" (trainer and in-process engine share it: colocated)."""

    def __post_init__(self) -> None:
        _require(
            self.rollout_dtype in DTYPE_NAMES,
            f"--rollout-dtype must be one of {DTYPE_NAMES}, got {self.rollout_dtype!r}",
        )
        _require(
            self.train_dtype in DTYPE_NAMES,
            f"--train-dtype must be one of {DTYPE_NAMES}, got {self.train_dtype!r}",
        )
        _require(
            self.device.split(":")[0] in ("cpu", "cuda"),
            f"--device must be cpu or cuda[:N], got {self.device!r}",
        )
        if self.device.startswith("cuda"):
            import torch

            _require(
                torch.cuda.is_available(),
                f"--device {self.device}: this torch build or machine has no CUDA device",
            )


@dataclass(kw_only=True)
class DataConfig:
    """Prompt dataset (jsonl or parquet)."""

    prompt_data: str = str(DEFAULT_PROMPT_DATA)
    """`--prompt-data`: path to a .jsonl or .parquet file of prompts."""
    input_key: str = "question"
    """`--input-key`: field holding the prompt text (or a list of chat messages)."""
    label_key: str = "answer"
    """`--label-key`: field holding the reference answer passed to the reward function."""
    apply_chat_template: bool = True
    """`--apply-chat-template`: wrap the prompt with the tokenizer's chat template."""
    rollout_shuffle: bool = True
    """`--rollout-shuffle`: shuffle prompts each epoch (seeded by `--seed` and the epoch)."""

    def __post_init__(self) -> None:
        _require(bool(self.input_key), "--input-key must not be empty")
        _require(bool(self.label_key), "--label-key must not be empty")


@dataclass(kw_only=True)
class RolloutConfig:
    """How many prompts and answers each rollout produces and how they are sampled."""

    num_rollout: int = 8
    """`--num-rollout`: number of rollouts (= GRPO iterations) in the run."""
    rollout_batch_size: int = 8
    """`--rollout-batch-size`: prompts per rollout."""
    n_samples_per_prompt: int = 8
    """`--n-samples-per-prompt`: answers per prompt (the GRPO group size)."""
    rollout_max_response_len: int = 32
    """`--rollout-max-response-len`: generation cap in tokens; answers that hit it are truncated."""
    rollout_temperature: float = 1.0
    """`--rollout-temperature`."""
    rollout_top_p: float = 1.0
    """`--rollout-top-p`."""
    rollout_top_k: int = 0
    """`--rollout-top-k` (0 disables; Miles uses -1 for the same)."""
    engine_failure_timeout: float = 60.0
    """`--engine-failure-timeout`: seconds of failed engine calls and health checks before the run stops
    with an error naming the engine (never retry forever: Miles 101 manual, section 1.2)."""

    def __post_init__(self) -> None:
        _require(
            0 < self.engine_failure_timeout < math.inf,
            f"--engine-failure-timeout must be a finite number of seconds > 0, got {self.engine_failure_timeout}",
        )
        _require(self.num_rollout >= 1, f"--num-rollout must be >= 1, got {self.num_rollout}")
        _require(
            self.rollout_batch_size >= 1, f"--rollout-batch-size must be >= 1, got {self.rollout_batch_size}"
        )
        _require(
            self.n_samples_per_prompt >= 1,
            f"--n-samples-per-prompt must be >= 1, got {self.n_samples_per_prompt}",
        )
        _require(
            self.rollout_max_response_len >= 1,
            f"--rollout-max-response-len must be >= 1, got {self.rollout_max_response_len}",
        )
        _require(
            self.rollout_temperature > 0, f"--rollout-temperature must be > 0, got {self.rollout_temperature}"
        )
        _require(0 < self.rollout_top_p <= 1, f"--rollout-top-p must be in (0, 1], got {self.rollout_top_p}")
        if self.rollout_top_k < 0:
            self.rollout_top_k = 0

    @property
    def samples_per_rollout(self) -> int:
        """rollout_batch_size × n_samples_per_prompt."""
        return self.rollout_batch_size * self.n_samples_per_prompt


@dataclass(kw_only=True)
class RewardConfig:
    """Reward model selection (Miles `--rm-type`, `--custom-rm-path`, `--group-rm`, `--reward-key`)."""

    rm_type: str | None = "math"
    custom_rm_path: str | None = None
    group_rm: bool = False
    reward_key: str | None = None

    def __post_init__(self) -> None:
        _require(
            self.rm_type is not None or self.custom_rm_path is not None,
            "one of --rm-type or --custom-rm-path is required",
        )
        _require(
            not self.group_rm or self.custom_rm_path is not None,
            "--group-rm needs --custom-rm-path (a function scoring a whole group)",
        )


@dataclass(kw_only=True)
class AlgorithmConfig:
    """GRPO advantages and the PPO-style loss (Miles notes 5.1-5.7)."""

    advantage_estimator: str = "grpo"
    disable_grpo_std_normalization: bool = False
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    """`--eps-clip-high`; None means equal to `--eps-clip` (Miles)."""
    eps_clip_c: float | None = None
    """`--eps-clip-c`: dual-clip constant (> 1), None disables."""
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    entropy_coef: float = 0.0
    calculate_per_token_loss: bool = False
    """`--calculate-per-token-loss`: token mean over the optimizer window instead of sample mean."""

    def __post_init__(self) -> None:
        _require(
            self.advantage_estimator == "grpo",
            f"--advantage-estimator: only 'grpo' is supported, got {self.advantage_estimator!r}",
        )
        _require(self.eps_clip > 0, f"--eps-clip must be > 0, got {self.eps_clip}")
        if self.eps_clip_high is None:
            self.eps_clip_high = self.eps_clip
        _require(self.eps_clip_high > 0, f"--eps-clip-high must be > 0, got {self.eps_clip_high}")
        _require(
            self.eps_clip_c is None or self.eps_clip_c > 1, f"--eps-clip-c must be > 1, got {self.eps_clip_c}"
        )
        _require(
            self.kl_loss_type in KL_LOSS_TYPES,
            f"--kl-loss-type must be one of {KL_LOSS_TYPES}, got {self.kl_loss_type!r}",
        )
        _require(self.kl_loss_coef >= 0, f"--kl-loss-coef must be >= 0, got {self.kl_loss_coef}")
        _require(
            0 <= self.tis_clip_low < self.tis_clip,
            f"--tis-clip-low/--tis-clip must satisfy 0 <= low < high, got {self.tis_clip_low}, {self.tis_clip}",
        )


@dataclass(kw_only=True)
class OptimizerConfig:
    """Batching into optimizer steps and the AdamW optimizer."""

    global_batch_size: int | None = None
    """`--global-batch-size`: samples per optimizer step; None = all samples of a rollout (one step per rollout)."""
    micro_batch_size: int = 16
    """`--micro-batch-size`: samples per forward/backward; does not change the objective."""
    lr: float = 2e-4
    clip_grad: float = 1.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8

    def __post_init__(self) -> None:
        _require(
            self.global_batch_size is None or self.global_batch_size >= 1,
            f"--global-batch-size must be >= 1, got {self.global_batch_size}",
        )
        _require(self.micro_batch_size >= 1, f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        _require(self.lr >= 0, f"--lr must be >= 0, got {self.lr}")
        _require(self.clip_grad >= 0, f"--clip-grad must be >= 0 (0 disables), got {self.clip_grad}")


@dataclass(kw_only=True)
class ColocateConfig:
    """Engine and trainer share the devices; state is offloaded around each phase."""

    colocate: bool = True
    offload_train: bool = True
    offload_rollout: bool = True
    update_weight_buffer_size: int = 512 * 1024**2
    """`--update-weight-buffer-size`: bytes per weight-sync bucket (Miles default 512 MiB)."""

    def __post_init__(self) -> None:
        _require(
            self.update_weight_buffer_size >= 1,
            f"--update-weight-buffer-size must be >= 1 byte, got {self.update_weight_buffer_size}",
        )


@dataclass(kw_only=True)
class CheckpointConfig:
    """`--save DIR` / `--load DIR` / `--save-interval N` (in rollouts)."""

    save: str | None = None
    load: str | None = None
    save_interval: int | None = None

    def __post_init__(self) -> None:
        _require(
            self.save_interval is None or self.save_interval >= 1,
            f"--save-interval must be >= 1, got {self.save_interval}",
        )
        _require(self.save_interval is None or self.save is not None, "--save-interval needs --save DIR")
        from pathlib import Path as _Path

        if self.save is not None:
            _require(
                not _Path(self.save).is_file(),
                f"--save {self.save}: is a file; expected a directory for checkpoints",
            )
        if self.load is not None:
            load = _Path(self.load)
            _require(
                load.is_dir(),
                f"--load {self.load}: no such directory (give the --save directory of a run; an existing empty directory starts fresh)",
            )


@dataclass(kw_only=True)
class DebugConfig:
    """Cut the loop in half (Miles debugging page): rollout-only capture, train-only replay, inject."""

    debug_rollout_only: bool = False
    """`--debug-rollout-only`: generation only; the trainer's optimizer and backward are never built."""
    debug_train_only: bool = False
    """`--debug-train-only`: no engine is built (implied by `--load-debug-rollout-data`)."""
    save_debug_rollout_data: str | None = None
    """`--save-debug-rollout-data`: template with `{rollout_id}`; every rollout is recorded there."""
    load_debug_rollout_data: str | None = None
    """`--load-debug-rollout-data`: train from these recordings instead of generating."""
    load_debug_rollout_data_subsample: float | None = None
    """`--load-debug-rollout-data-subsample F`: keep about F of each recording's samples."""
    allow_recording_mismatch: bool = False
    """`--allow-recording-mismatch`: replay a recording made with another model/tokenizer/config."""
    ci_inject_rollout_data_path: str | None = None
    """`--ci-inject-rollout-data-path`: generate, compare with this recording, train on the recording."""
    ci_inject_rollout_data_start_rollout_id: int = 0
    ci_inject_rollout_data_min_match_ratio: float = 0.9
    """Mean response-token match ratio must be strictly greater than this (Miles default 0.9)."""
    debug_skip_weight_update: bool = False
    """`--debug-skip-weight-update`: keep the offload/onload schedule but do not send weights."""
    debug_disable_optimizer: bool = False
    """`--debug-disable-optimizer`: no optimizer or scheduler; forward and backward still run."""
    debug_exit_after_rollout: int | None = None
    """`--debug-exit-after-rollout N`: stop after rollout N."""
    save_debug_event_data: str | None = None
    """`--save-debug-event-data DIR`: the run's events.jsonl is written there as well."""

    def __post_init__(self) -> None:
        from grpolab.replay.recording import format_path

        if self.load_debug_rollout_data is not None:
            self.debug_train_only = True
        _require(
            not (self.debug_rollout_only and self.debug_train_only),
            "--debug-rollout-only and --debug-train-only (or --load-debug-rollout-data) exclude each other: "
            "one generates without training, the other trains without generating",
        )
        _require(
            not self.debug_train_only or self.load_debug_rollout_data is not None,
            "--debug-train-only needs --load-debug-rollout-data PATH: without an engine the recordings are the only data",
        )
        for flag, template in (
            ("--save-debug-rollout-data", self.save_debug_rollout_data),
            ("--load-debug-rollout-data", self.load_debug_rollout_data),
            ("--ci-inject-rollout-data-path", self.ci_inject_rollout_data_path),
        ):
            if template is not None:
                try:
                    format_path(template, 0)
                except ValueError as e:
                    raise ValueError(f"{flag}: {e}") from None
        if self.ci_inject_rollout_data_path is not None:
            _require(
                not self.debug_train_only,
                "--ci-inject-rollout-data-path needs engines; it excludes --debug-train-only/--load-debug-rollout-data",
            )
            _require(
                not self.debug_rollout_only,
                "--ci-inject-rollout-data-path trains on the recording; it excludes --debug-rollout-only",
            )
        _require(
            self.ci_inject_rollout_data_start_rollout_id >= 0,
            "--ci-inject-rollout-data-start-rollout-id must be >= 0",
        )
        _require(
            0 <= self.ci_inject_rollout_data_min_match_ratio <= 1,
            "--ci-inject-rollout-data-min-match-ratio must be in [0, 1]",
        )
        _require(
            self.load_debug_rollout_data_subsample is None or 0 < self.load_debug_rollout_data_subsample <= 1,
            f"--load-debug-rollout-data-subsample must be in (0, 1], got {self.load_debug_rollout_data_subsample}",
        )
        _require(
            self.load_debug_rollout_data_subsample is None or self.load_debug_rollout_data is not None,
            "--load-debug-rollout-data-subsample needs --load-debug-rollout-data",
        )
        _require(
            self.debug_exit_after_rollout is None or self.debug_exit_after_rollout >= 0,
            "--debug-exit-after-rollout must be >= 0",
        )


@dataclass(kw_only=True)
class EvalConfig:
    """Held-out evaluation (`--eval-interval`, `--eval-prompt-data NAME PATH [NAME PATH ...]`)."""

    eval_interval: int | None = None
    """Evaluate before rollouts whose id is a multiple of this, and after the last rollout."""
    eval_prompt_data: list[str] = field(default_factory=list)
    """Alternating dataset names and paths; metric `eval/<name>` is the mean reward."""
    n_samples_per_eval_prompt: int = 1
    eval_max_prompts: int | None = None
    """Use at most this many prompts of each eval set (file order)."""

    def __post_init__(self) -> None:
        _require(
            self.eval_interval is None or self.eval_interval >= 1,
            f"--eval-interval must be >= 1, got {self.eval_interval}",
        )
        _require(
            len(self.eval_prompt_data) % 2 == 0,
            f"--eval-prompt-data takes NAME PATH pairs, got {len(self.eval_prompt_data)} values: {self.eval_prompt_data}",
        )
        _require(
            self.eval_interval is None or bool(self.eval_prompt_data),
            "--eval-interval needs --eval-prompt-data NAME PATH",
        )
        _require(self.n_samples_per_eval_prompt >= 1, "--n-samples-per-eval-prompt must be >= 1")
        _require(
            self.eval_max_prompts is None or self.eval_max_prompts >= 1, "--eval-max-prompts must be >= 1"
        )

    @property
    def datasets(self) -> list[tuple[str, str]]:
        """(name, path) pairs."""
        it = iter(self.eval_prompt_data)
        return list(zip(it, it))


@dataclass(kw_only=True)
class CIConfig:
    """In-run checkers (`--ci-test`) and their escape hatches (Miles debugging page, manual 5.2/8.3)."""

    ci_test: bool = False
    ci_disable_kl_checker: bool = False
    ci_disable_logprobs_checker: bool = False
    ci_logprobs_checker_abs_tol: float = 0.03
    ci_disable_weight_update_checker: bool = False
    check_weight_update_equal: bool = False
    """Run the weight-update checker even without `--ci-test`."""
    ci_metric_checker_key: str | None = None
    ci_metric_checker_threshold: float | None = None
    ci_metric_checker_expect_num: int | None = None
    ci_save_grad_norm: str | None = None
    """Template with {role}, {rollout_id}, {step_id}: write each step's grad norm there."""
    ci_load_grad_norm: str | None = None
    """Template: compare each step's grad norm with the saved one (rel_tol = abs_tol = `--ci-grad-norm-rtol`)."""
    ci_grad_norm_rtol: float = 0.03
    ci_save_model_hash: bool = False
    """Write per-layer SHA-256 hashes next to every checkpoint."""
    ci_check_model_hash: bool = False
    """After `--load`, recompute the per-layer hashes and compare with the saved ones."""
    ci_max_abs_advantage: float = 10.0
    ci_ft_test_actions: str | None = None
    """JSON list of fault actions, e.g. '[{"at_rollout": 2, "action": "raise_in_train", "rank": 0}]'."""

    def __post_init__(self) -> None:
        _require(self.ci_logprobs_checker_abs_tol >= 0, "--ci-logprobs-checker-abs-tol must be >= 0")
        _require(self.ci_grad_norm_rtol >= 0, "--ci-grad-norm-rtol must be >= 0")
        _require(self.ci_max_abs_advantage > 0, "--ci-max-abs-advantage must be > 0")
        _require(
            (self.ci_metric_checker_key is None) == (self.ci_metric_checker_threshold is None),
            "--ci-metric-checker-key and --ci-metric-checker-threshold go together",
        )
        _require(
            self.ci_metric_checker_expect_num is None or self.ci_metric_checker_key is not None,
            "--ci-metric-checker-expect-num needs --ci-metric-checker-key",
        )
        from grpolab.checkers.grad_norm import validate_grad_norm_template

        for flag, template in (
            ("--ci-save-grad-norm", self.ci_save_grad_norm),
            ("--ci-load-grad-norm", self.ci_load_grad_norm),
        ):
            if template is not None:
                validate_grad_norm_template(template, flag=flag)
        if self.ci_ft_test_actions is not None:
            from grpolab.checkers.faults import parse_fault_actions

            parse_fault_actions(self.ci_ft_test_actions)  # ValueError names the flag and the field


MIN_GPU_SAMPLE_INTERVAL_S = 0.1
"""grpolab's floor for `--gpu-sample-interval` (seconds): NVML's utilization is measured over a sample
period "between 1 second and 1/6 second, depending on the product" (NVML API reference,
nvmlUtilization_t), so sampling faster than 0.1 s reads the same figures again while gpu.jsonl grows
(one line per GPU per sample); gpustat uses the same 0.1 s floor."""


@dataclass(kw_only=True)
class RunConfig:
    """Where the run directory goes and the run seed."""

    run_dir: str | None = None
    """`--run-dir`: the run directory; default `runs/<time>-<seed>`."""
    seed: int = 1234
    num_threads: int | None = None
    """`--num-threads`: torch intra-op threads (pinned; results differ between thread counts on CPU)."""
    show_progress: bool = True
    debug_deterministic_collective: bool = False
    """`--debug-deterministic-collective`: det_gloo/det_nccl backend, deterministic algorithms, 1 thread unless --num-threads."""
    gpu_sample_interval: float = 1.0
    """`--gpu-sample-interval`: seconds between NVML samples written to `gpu.jsonl` (0 disables, else at
    least MIN_GPU_SAMPLE_INTERVAL_S; nothing is sampled without an NVIDIA driver)."""

    def __post_init__(self) -> None:
        _require(
            0 <= self.seed < 2**63, f"--seed must be a non-negative integer below 2**63, got {self.seed}"
        )
        _require(
            self.num_threads is None or self.num_threads >= 1,
            f"--num-threads must be >= 1, got {self.num_threads}",
        )
        interval = self.gpu_sample_interval
        _require(
            interval == 0 or MIN_GPU_SAMPLE_INTERVAL_S <= interval < math.inf,
            f"--gpu-sample-interval must be 0 (no GPU sampling) or a finite number of seconds >= "
            f"{MIN_GPU_SAMPLE_INTERVAL_S:g}, got {interval:g} (NVML's utilization covers a sample period of "
            "1/6 s to 1 s, so faster sampling repeats its readings and only grows gpu.jsonl)",
        )


@dataclass(kw_only=True)
class Config:
    """The whole resolved configuration of a run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    colocate: ColocateConfig = field(default_factory=ColocateConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ci: CIConfig = field(default_factory=CIConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        samples = self.rollout.samples_per_rollout
        if self.optimizer.global_batch_size is None:
            self.optimizer.global_batch_size = samples
        gbs = self.optimizer.global_batch_size
        _require(
            self.ci.ci_metric_checker_key is None or bool(self.eval.eval_prompt_data),
            "--ci-metric-checker-key needs an eval: set --eval-interval and --eval-prompt-data NAME PATH",
        )
        _require(
            samples % gbs == 0,
            f"--global-batch-size {gbs} must divide the rollout's samples: --rollout-batch-size "
            f"{self.rollout.rollout_batch_size} × --n-samples-per-prompt {self.rollout.n_samples_per_prompt} = {samples}",
        )

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps per rollout = samples per rollout / global batch size."""
        assert self.optimizer.global_batch_size is not None
        return self.rollout.samples_per_rollout // self.optimizer.global_batch_size

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain dict, component name → field → value (JSON-serializable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, Any]]) -> Config:
        """Inverse of `to_dict`; unknown components or fields raise ValueError naming them."""
        kwargs = {}
        for f in dataclasses.fields(cls):
            section = dict(data.get(f.name, {}))
            component = f.default_factory  # type: ignore[misc]
            known = {g.name for g in dataclasses.fields(component)}
            unknown = set(section) - known
            _require(not unknown, f"config section {f.name!r} has unknown fields {sorted(unknown)}")
            kwargs[f.name] = component(**section)
        extra = set(data) - {f.name for f in dataclasses.fields(cls)}
        _require(not extra, f"config has unknown sections {sorted(extra)}")
        return cls(**kwargs)
