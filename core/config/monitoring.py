"""Config sections for watching a run from outside: metric sinks (wandb, TensorBoard, a custom rollout
logger) and profiling (the PyTorch profiler, memory snapshots).

Flag names and meanings are Miles' (reference/miles-monitoring.md, "Enabling wandb", "Custom
loggers", "Built-in PyTorch profiler"). The string after each field is its documentation and the help
text of its `grpolab train` flag. Nothing here imports wandb, tensorboard or memray: whether they are
installed is checked when the run starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpolab.core.config.validation import require

WANDB_MODES = ("online", "offline", "disabled")
"""`--wandb-mode` values (wandb.init's `mode`; "offline" writes files under --wandb-dir, no network)."""
PROFILE_TARGETS = ("train_overall", "train_actor", "train_log_probs")
"""`--profile-target` values (Miles monitoring page): whole rollout steps, or the micro-batch loop of
each optimizer step (train_actor) or of the log-prob forward (train_log_probs)."""
MEMORY_RECORDERS = ("torch", "memray")
"""`--memory-recorder` values: torch's CUDA allocator history, or memray's host-memory tracker."""


@dataclass(kw_only=True)
class MonitoringConfig:
    """Where metrics go besides metrics.jsonl: wandb, TensorBoard, a custom rollout logger (Miles flags)."""

    use_wandb: bool = False
    """Log metrics to Weights & Biases under train/, rollout/, perf/, eval/ (needs the `monitoring` extra;
    the API key comes from WANDB_API_KEY and is never stored)."""
    wandb_project: str | None = None
    """wandb project (default: "grpolab")."""
    wandb_group: str | None = None
    """wandb group (optional; runs without one are ungrouped)."""
    wandb_mode: str | None = None
    """wandb mode: online, offline (files only, no network) or disabled (default: wandb's own,
    WANDB_MODE or online)."""
    wandb_dir: str | None = None
    """Directory for wandb's files (default: RUN_DIR/wandb)."""
    wandb_run_name: str | None = None
    """wandb run name (default: the run directory's name)."""
    use_tensorboard: bool = False
    """Write the same scalars as TensorBoard event files (needs the `monitoring` extra)."""
    tensorboard_dir: str | None = None
    """TensorBoard log directory (default: $TENSORBOARD_DIR, else RUN_DIR/tensorboard); also where
    profiler traces go."""
    custom_rollout_log_function_path: str | None = None
    """pkg.mod.fn called after each rollout as fn(rollout_id, args, samples, extra, rollout_time) -> bool
    (sync or async); True replaces the default rollout logging, False keeps it."""

    def __post_init__(self) -> None:
        require(
            self.wandb_mode is None or self.wandb_mode in WANDB_MODES,
            f"--wandb-mode must be one of {', '.join(WANDB_MODES)}, got {self.wandb_mode!r}",
        )
        path = self.custom_rollout_log_function_path
        require(
            path is None or (path.count(".") >= 1 and all(p.isidentifier() for p in path.split("."))),
            f"--custom-rollout-log-function-path must be a dotted path pkg.module.function, got {path!r}",
        )


@dataclass(kw_only=True)
class ProfilingConfig:
    """The PyTorch profiler and memory snapshots (Miles' profiling flags, reference/miles-monitoring.md)."""

    use_pytorch_profiler: bool = False
    """Trace steps --profile-step-start .. --profile-step-end - 1 with torch.profiler (one gzipped Chrome
    trace per traced rank, under --tensorboard-dir or RUN_DIR/profile)."""
    profile_step_start: int = 10
    """First traced step (rollout id for train_overall; micro-batch index for the other targets)."""
    profile_step_end: int = 12
    """Tracing stops before this step (exclusive)."""
    profile_ranks: list[int] = field(default_factory=list, metadata={"metavar": "RANK"})
    """Global ranks to trace (none given: every rank)."""
    profile_target: str = "train_overall"
    """What a step is: train_overall (a whole rollout step), train_actor or train_log_probs (the
    micro-batches of each optimizer step / of the log-prob forward; the window restarts every step)."""
    pytorch_profiler_collect_callstack: bool = False
    """Record Python call stacks in the trace (much larger traces)."""
    pytorch_profiler_collect_shapes: bool = False
    """Record tensor shapes in the trace."""
    record_memory_history: bool = False
    """Record a memory snapshot (needs --profile-target train_overall) once rollout
    --memory-snapshot-num-steps - 1 has trained."""
    memory_snapshot_dir: str | None = None
    """Directory for memory snapshots (default: RUN_DIR/memory)."""
    memory_snapshot_num_steps: int = 1
    """The snapshot is written once rollout id N - 1 has trained."""
    memory_recorder: str = "torch"
    """torch (the CUDA caching allocator's history; also written on a CUDA OOM) or memray (host memory;
    needs the `monitoring` extra)."""

    def __post_init__(self) -> None:
        require(
            self.profile_target in PROFILE_TARGETS,
            f"--profile-target must be one of {', '.join(PROFILE_TARGETS)}, got {self.profile_target!r}",
        )
        require(
            self.memory_recorder in MEMORY_RECORDERS,
            f"--memory-recorder must be one of {', '.join(MEMORY_RECORDERS)}, got {self.memory_recorder!r}",
        )
        require(
            self.profile_step_start >= 0, f"--profile-step-start must be >= 0, got {self.profile_step_start}"
        )
        require(
            self.profile_step_end > self.profile_step_start,
            f"--profile-step-end ({self.profile_step_end}) must be greater than --profile-step-start "
            f"({self.profile_step_start}): steps start .. end-1 are traced",
        )
        bad = [r for r in self.profile_ranks if r < 0]
        require(not bad, f"--profile-ranks must be global ranks >= 0, got {bad}")
        require(
            self.memory_snapshot_num_steps >= 1,
            f"--memory-snapshot-num-steps must be >= 1, got {self.memory_snapshot_num_steps}",
        )
        require(
            not self.record_memory_history or self.profile_target == "train_overall",
            f"--record-memory-history needs --profile-target train_overall (got {self.profile_target}): "
            "a snapshot covers whole rollout steps (Miles monitoring page)",
        )
