"""Run configuration: one keyword-only dataclass per component, validated on construction.

Field names follow Miles flags (`--rollout-batch-size` -> `rollout_batch_size`); the string after each
field is its documentation and the help text of its `grpolab train` flag, and its default is the one
default of the run: `core/config/flags.py` generates the flags from these classes (field metadata
`flag` names the few flags whose Miles name differs). Every check raises ValueError naming the flag
and what was expected; valid names come from the registries that use them (KL and advantage
estimators in core/algorithms.py, dtypes in core/dtypes.py). No check depends on this machine's
hardware, so `Config.from_dict` reads any run's run.json anywhere; `grpolab train` checks the device
when it starts (train/launch.py). `Config.to_dict()` is what run.json stores as the resolved config.

Sections: `generation` (model, data, rollout, reward, eval), `agent` (multi-turn tool rollouts),
`dynamic_sampling` (the group filter and over-sampling), `training` (algorithm, optimizer,
colocate, checkpoint), `debugging` (debug, ci), `monitoring` (monitoring, profiling) and `RunConfig` below. Importing this package imports
no torch; constructing a config imports the registries (and so torch).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from grpolab.core.config.agent import AgentConfig
from grpolab.core.config.debugging import CIConfig, DebugConfig
from grpolab.core.config.dynamic_sampling import DynamicSamplingConfig
from grpolab.core.config.generation import (
    DEFAULT_CHECKPOINT,
    DEFAULT_PROMPT_DATA,
    FIXTURES_DIR,
    DataConfig,
    EvalConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
)
from grpolab.core.config.monitoring import MonitoringConfig, ProfilingConfig
from grpolab.core.config.training import AlgorithmConfig, CheckpointConfig, ColocateConfig, OptimizerConfig
from grpolab.core.config.validation import require, require_finite
from grpolab.core.lr_schedule import LRSchedule

__all__ = [
    "AgentConfig",
    "DEFAULT_CHECKPOINT",
    "DEFAULT_PROMPT_DATA",
    "FIXTURES_DIR",
    "MIN_GPU_SAMPLE_INTERVAL_S",
    "AlgorithmConfig",
    "CIConfig",
    "CheckpointConfig",
    "ColocateConfig",
    "Config",
    "DataConfig",
    "DebugConfig",
    "DynamicSamplingConfig",
    "EvalConfig",
    "ModelConfig",
    "MonitoringConfig",
    "OptimizerConfig",
    "ProfilingConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "sections",
]

MIN_GPU_SAMPLE_INTERVAL_S = 0.1
"""grpolab's floor for `--gpu-sample-interval` (seconds): NVML's utilization is measured over a sample
period "between 1 second and 1/6 second, depending on the product" (NVML API reference,
nvmlUtilization_t), so sampling faster than 0.1 s reads the same figures again while gpu.jsonl grows
(one line per GPU per sample); gpustat uses the same 0.1 s floor."""


@dataclass(kw_only=True)
class RunConfig:
    """The run itself: its directory, seed, threads and what it prints and samples."""

    run_dir: str | None = None
    """Run directory (default runs/<time>-s<seed>)."""
    seed: int = 1234
    """Run seed (a non-negative integer below 2**63)."""
    num_threads: int | None = None
    """Torch CPU intra-op threads, pinned (results differ between thread counts on CPU: pin for
    bitwise-reproducible CPU runs)."""
    show_progress: bool = field(default=True, metadata={"flag": "--progress"})
    """Progress bar during generation."""
    debug_deterministic_collective: bool = False
    """Fold SUM/AVG reductions in a fixed order (det_gloo/det_nccl backend, deterministic algorithms,
    1 thread unless --num-threads); slow, for bitwise comparisons."""
    gpu_sample_interval: float = 1.0
    """Seconds between NVML samples written to gpu.jsonl (0 disables, else >= 0.1; nothing is sampled
    without an NVIDIA driver).

    The floor is MIN_GPU_SAMPLE_INTERVAL_S."""

    def __post_init__(self) -> None:
        require(0 <= self.seed < 2**63, f"--seed must be a non-negative integer below 2**63, got {self.seed}")
        require(
            self.num_threads is None or self.num_threads >= 1,
            f"--num-threads must be >= 1, got {self.num_threads}",
        )
        interval = self.gpu_sample_interval
        require(
            interval == 0 or MIN_GPU_SAMPLE_INTERVAL_S <= interval < math.inf,
            f"--gpu-sample-interval must be 0 (no GPU sampling) or a finite number of seconds >= "
            f"{MIN_GPU_SAMPLE_INTERVAL_S:g}, got {interval:g} (NVML's utilization covers a sample period of "
            "1/6 s to 1 s, so faster sampling repeats its readings and only grows gpu.jsonl)",
        )


@dataclass(kw_only=True)
class Config:
    """The whole resolved configuration of a run: one section per component."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    colocate: ColocateConfig = field(default_factory=ColocateConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ci: CIConfig = field(default_factory=CIConfig)
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        for name in sections():
            require_finite(getattr(self, name))
        samples = self.rollout.samples_per_rollout
        if self.optimizer.global_batch_size is None:
            self.optimizer.global_batch_size = samples
        gbs = self.optimizer.global_batch_size
        require(
            not (self.debug.debug_train_only and self.rollout.uses_servers),
            "--rollout-num-engines / --sglang-router-ip need a rollout engine, but --debug-train-only "
            "(or --load-debug-rollout-data) trains on recordings without one: drop one of them",
        )
        require(  # after the engines conflict: `--rollout-num-engines 2 --debug-train-only` names that first
            not self.debug.debug_train_only or self.debug.load_debug_rollout_data is not None,
            "--debug-train-only needs --load-debug-rollout-data PATH: without an engine the recordings are the only data",
        )
        require(
            self.agent.custom_agent_function_path is None or self.data.apply_chat_template,
            "--custom-agent-function-path needs --apply-chat-template: the agent sends chat messages, "
            "rendered with the checkpoint's chat template",
        )
        require(
            self.agent.custom_agent_function_path is None or self.rollout.sglang_router_ip is None,
            "--custom-agent-function-path runs on the in-process engine or a fleet grpolab launches "
            "(--rollout-num-engines, whose engines serve /sessions); the engines behind --sglang-router-ip "
            "may not (use --custom-generate-function-path)",
        )
        require(
            not self.agent.multi_turn or self.data.apply_chat_template,
            "--generate-execute-tool-function-path needs --apply-chat-template: the tool loop renders each "
            "turn's messages with the checkpoint's chat template",
        )
        over = self.dynamic_sampling.over_sampling_batch_size
        require(
            over is None or over >= self.rollout.rollout_batch_size,
            f"--over-sampling-batch-size {over} must be >= --rollout-batch-size "
            f"{self.rollout.rollout_batch_size} (Miles: each round submits at least one rollout's prompts)",
        )
        require(
            not self.dynamic_sampling.active or not self.debug.debug_train_only,
            "--dynamic-sampling-filter-path filters generated groups, but --debug-train-only (or "
            "--load-debug-rollout-data) trains on recordings, already filtered when they were recorded: drop one",
        )
        require(
            self.ci.ci_metric_checker_key is None or bool(self.eval.eval_prompt_data),
            "--ci-metric-checker-key needs an eval: set --eval-interval and --eval-prompt-data NAME PATH",
        )
        require(
            samples % gbs == 0,
            f"--global-batch-size {gbs} must divide the rollout's samples: --rollout-batch-size "
            f"{self.rollout.rollout_batch_size} × --n-samples-per-prompt {self.rollout.n_samples_per_prompt} = {samples}",
        )
        self.lr_schedule()  # schedule flags that contradict are flag errors (exit 2)

    def lr_schedule(self) -> LRSchedule:
        """The run's learning-rate schedule, `--lr-decay-iters` defaulting to its last optimizer step.

        Raises:
            ValueError: the schedule flags contradict (core/lr_schedule.py names them).
        """
        opt = self.optimizer
        total = self.rollout.num_rollout * self.steps_per_rollout
        return LRSchedule(style=opt.lr_decay_style, lr=opt.lr, min_lr=opt.min_lr, warmup_iters=opt.lr_warmup_iters,
                          decay_iters=opt.lr_decay_iters if opt.lr_decay_iters is not None else max(total, opt.lr_warmup_iters, 1),
                          warmup_init=opt.lr_warmup_init)  # fmt: skip

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
        """Inverse of `to_dict`, as strict as the flags (the hardware is not checked, see the module); a
        section lacking a field of `BEFORE_FIELD_EXISTED` gets that value, not the default.

        Raises:
            ValueError: an unknown section or field (named), or a value a section rejects.
        """
        kwargs = {}
        for name, component in sections().items():
            section = dict(data.get(name, {}))
            if name in data:  # a section written before some of its fields existed
                section = {**BEFORE_FIELD_EXISTED.get(name, {}), **section}
            known = {g.name for g in dataclasses.fields(component)}
            unknown = set(section) - known
            require(not unknown, f"config section {name!r} has unknown fields {sorted(unknown)}")
            kwargs[name] = component(**section)
        extra = set(data) - set(kwargs)
        require(not extra, f"config has unknown sections {sorted(extra)}")
        return cls(**kwargs)


BEFORE_FIELD_EXISTED: dict[str, dict[str, Any]] = {"model": {"train_forward": "padded"}}
"""Section → field → the value a run.json written before the field existed ran with, where that is not
the field's default (`from_dict` fills it in): runs before `--train-forward` trained padded."""


def sections() -> dict[str, type]:
    """Section name (a `Config` field, e.g. "optimizer") → its dataclass, in `Config` field order."""
    return {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]
