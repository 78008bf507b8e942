"""Config sections of the training side: the loss, the optimizer, colocation and checkpoints.

The string after each field is its documentation and the help text of its `grpolab train` flag.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from grpolab.core.config.validation import require

BUILTIN_ADVANTAGE_ESTIMATORS = ("grpo",)
"""The names core/algorithms.py registers in ADVANTAGE_ESTIMATORS (a test checks they are equal): a built-in
name is accepted without importing core/algorithms.py, which imports torch (a flag error of `grpolab
train` answers before torch loads); any other name is looked up in the registry itself."""
BUILTIN_KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
"""The names core/algorithms.py registers in KL_ESTIMATORS (as BUILTIN_ADVANTAGE_ESTIMATORS)."""


def _check_estimator(name: str, builtin: tuple[str, ...], registry: str) -> None:
    """Accept a built-in estimator name, or one registered since in core/algorithms.py's `registry`.

    core/algorithms.py (which imports torch) is only consulted when it was imported already: before
    that, nothing can have registered another name, so a flag error answers without torch.

    Raises:
        ValueError: an unknown name, naming the flag and listing the valid names (`Registry.get`'s text).
    """
    if name in builtin:
        return
    algorithms = sys.modules.get("grpolab.core.algorithms")
    if algorithms is not None:
        getattr(algorithms, registry).get(name)
        return
    kind, flag = {
        "ADVANTAGE_ESTIMATORS": ("advantage estimator", "--advantage-estimator"),
        "KL_ESTIMATORS": ("KL estimator", "--kl-loss-type"),
    }[registry]
    raise ValueError(f"unknown {kind} {name!r} ({flag}); valid: {', '.join(sorted(builtin))}")


@dataclass(kw_only=True)
class AlgorithmConfig:
    """GRPO advantages and the PPO-style loss (Miles notes 5.1-5.7)."""

    advantage_estimator: str = "grpo"
    """Advantage estimator: grpo.

    The valid names are core/algorithms.py's ADVANTAGE_ESTIMATORS (validated against it; a test checks
    the list above)."""
    disable_grpo_std_normalization: bool = False
    """Dr.GRPO: subtract the group mean only (no division by the group's std)."""
    eps_clip: float = 0.2
    """PPO clip range."""
    eps_clip_high: float | None = None
    """Upper clip (default: --eps-clip, as in Miles)."""
    eps_clip_c: float | None = None
    """Dual-clip constant (> 1); unset disables dual clipping."""
    use_kl_loss: bool = False
    """Add the KL to the reference model to the loss."""
    kl_loss_coef: float = 0.0
    """KL loss coefficient (>= 0)."""
    kl_loss_type: str = "k1"
    """KL estimator: k1 | k2 | k3 | low_var_kl.

    The valid names are core/algorithms.py's KL_ESTIMATORS (validated against it; a test checks the
    list above)."""
    use_tis: bool = False
    """Truncated importance sampling against the engine's log-probs."""
    tis_clip: float = 2.0
    """TIS upper clip."""
    tis_clip_low: float = 0.0
    """TIS lower clip (0 <= low < --tis-clip)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient."""
    calculate_per_token_loss: bool = False
    """Token mean over the optimizer window instead of the sample mean."""

    def __post_init__(self) -> None:
        _check_estimator(self.advantage_estimator, BUILTIN_ADVANTAGE_ESTIMATORS, "ADVANTAGE_ESTIMATORS")
        require(self.eps_clip > 0, f"--eps-clip must be > 0, got {self.eps_clip}")
        if self.eps_clip_high is None:
            self.eps_clip_high = self.eps_clip
        require(self.eps_clip_high > 0, f"--eps-clip-high must be > 0, got {self.eps_clip_high}")
        require(
            self.eps_clip_c is None or self.eps_clip_c > 1, f"--eps-clip-c must be > 1, got {self.eps_clip_c}"
        )
        _check_estimator(self.kl_loss_type, BUILTIN_KL_ESTIMATORS, "KL_ESTIMATORS")
        require(self.kl_loss_coef >= 0, f"--kl-loss-coef must be >= 0, got {self.kl_loss_coef}")
        require(
            0 <= self.tis_clip_low < self.tis_clip,
            f"--tis-clip-low/--tis-clip must satisfy 0 <= low < high, got {self.tis_clip_low}, {self.tis_clip}",
        )


@dataclass(kw_only=True)
class OptimizerConfig:
    """Batching into optimizer steps, the AdamW optimizer and its learning-rate schedule (core/lr_schedule.py)."""

    global_batch_size: int | None = None
    """Samples per optimizer step (default: all samples of a rollout, one step per rollout)."""
    micro_batch_size: int = 16
    """Samples per forward/backward; does not change the objective."""
    lr: float = 2e-4
    """AdamW learning rate (the peak of a schedule: --lr-decay-style)."""
    lr_decay_style: str = "constant"
    """constant | linear | cosine (Megatron's names): after the warm-up the lr stays at --lr, or decays from
    --lr to --min-lr over --lr-decay-iters optimizer steps."""
    lr_warmup_iters: int = 0
    """Optimizer steps of linear warm-up from --lr-warmup-init to --lr (0: none)."""
    lr_decay_iters: int | None = None
    """Optimizer step at which the decay reaches --min-lr (default: the run's last, --num-rollout x steps
    per rollout; >= --lr-warmup-iters)."""
    min_lr: float = 0.0
    """The lr the decay ends at, in [0, --lr]."""
    lr_warmup_init: float = 0.0
    """The lr of the first warm-up step, in [0, --lr]."""
    clip_grad: float = 1.0
    """Gradient norm clip (0 disables)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1, the decay of the gradient's running mean, in [0, 1)."""
    adam_beta2: float = 0.98
    """AdamW beta2, the decay of the squared gradient's running mean, in [0, 1)."""
    adam_eps: float = 1e-8
    """AdamW epsilon added to the denominator (>= 0)."""

    def __post_init__(self) -> None:
        require(
            self.global_batch_size is None or self.global_batch_size >= 1,
            f"--global-batch-size must be >= 1, got {self.global_batch_size}",
        )
        require(self.micro_batch_size >= 1, f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        require(self.lr >= 0, f"--lr must be >= 0, got {self.lr}")
        require(self.clip_grad >= 0, f"--clip-grad must be >= 0 (0 disables), got {self.clip_grad}")
        require(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        for flag, beta in (("--adam-beta1", self.adam_beta1), ("--adam-beta2", self.adam_beta2)):
            require(0 <= beta < 1, f"{flag} must be in [0, 1), got {beta}")  # torch.optim.AdamW's own ranges
        require(self.adam_eps >= 0, f"--adam-eps must be >= 0, got {self.adam_eps}")


@dataclass(kw_only=True)
class ColocateConfig:
    """Engine and trainer share the devices; state is offloaded around each phase."""

    colocate: bool = True
    """Engine and trainer share devices (offload around phases)."""
    offload_train: bool = True
    """Offload trainer state during rollout."""
    offload_rollout: bool = True
    """Release engine memory during training."""
    update_weight_buffer_size: int = 512 * 1024**2
    """Bytes per weight-sync bucket (Miles default 512 MiB)."""

    def __post_init__(self) -> None:
        require(
            self.update_weight_buffer_size >= 1,
            f"--update-weight-buffer-size must be >= 1 byte, got {self.update_weight_buffer_size}",
        )


@dataclass(kw_only=True)
class CheckpointConfig:
    """Checkpoints: where to save, how often, where to resume from.

    Whether the --save/--load paths exist is checked at run start (`train.launch.check_on_this_machine`),
    not here: a run.json must read back on a machine that lacks the run's directories.
    """

    save: str | None = None
    """Checkpoint directory."""
    load: str | None = None
    """Resume from the newest checkpoint here (an iter_* directory also works; an existing empty
    directory starts fresh; a missing path is an error)."""
    save_interval: int | None = None
    """Save every N rollouts (and at the end); needs --save."""
    allow_data_change: bool = False
    """Let --load resume a checkpoint saved with other data (another --prompt-data content or row
    count, --rollout-batch-size, --seed or --rollout-shuffle), with a warning; without it such a
    checkpoint is refused, naming what differs (the rows each rollout reads would change)."""

    def __post_init__(self) -> None:
        require(
            self.save_interval is None or self.save_interval >= 1,
            f"--save-interval must be >= 1, got {self.save_interval}",
        )
        require(self.save_interval is None or self.save is not None, "--save-interval needs --save DIR")
