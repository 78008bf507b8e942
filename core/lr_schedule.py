"""The learning-rate schedule: Megatron's `OptimizerParamScheduler.get_lr` as a pure function of the step.

Miles passes Megatron's flags (`--lr-decay-style`, `--lr-warmup-iters`, `--lr-decay-iters`, `--min-lr`,
`--lr-warmup-init`); the schedule is stepped once per optimizer step (Megatron's `increment` of 1 per
iteration; the Miles-101 manual's long-runs chapter: a resumed run continues at the next step). With
`step` the optimizer steps already taken (0 for the first):

- warm-up (`warmup_iters` W > 0 and step <= W): `warmup_init + (lr - warmup_init) * step / W`;
- `constant`: `lr`;
- past `decay_iters` D: `min_lr`;
- otherwise, with r = (step - W) / (D - W): `min_lr + c * (lr - min_lr)`, c = 1 - r (`linear`) or
  (cos(pi r) + 1) / 2 (`cosine`).

Pure: no torch, no I/O. `core/actor.py` turns it into the optimizer's LambdaLR; checkpoints stamp
`as_dict()` and the lr of the next step, and a resume with another schedule is refused
(`resume_mismatch`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

DECAY_STYLES = ("constant", "linear", "cosine")
"""`--lr-decay-style` values (Megatron's names; its inverse-square-root and WSD are not built)."""


@dataclass(frozen=True)
class LRSchedule:
    """One run's schedule (see the module docstring); lrs in the optimizer's units, steps in optimizer steps.

    Raises:
        ValueError: an unknown style, a negative count, `decay_iters` < `warmup_iters` (naming both
            flags), or `min_lr` / `warmup_init` outside [0, lr].
    """

    style: str
    lr: float
    min_lr: float = 0.0
    warmup_iters: int = 0
    decay_iters: int = 1
    warmup_init: float = 0.0

    def __post_init__(self) -> None:
        if self.style not in DECAY_STYLES:
            raise ValueError(f"--lr-decay-style must be one of {', '.join(DECAY_STYLES)}, got {self.style!r}")
        if self.warmup_iters < 0:
            raise ValueError(f"--lr-warmup-iters must be >= 0, got {self.warmup_iters}")
        if self.decay_iters < max(self.warmup_iters, 1):
            raise ValueError(
                f"--lr-decay-iters {self.decay_iters} must be >= 1 and >= --lr-warmup-iters {self.warmup_iters} "
                "(the decay starts where the warm-up ends)"
            )
        for flag, value in (("--min-lr", self.min_lr), ("--lr-warmup-init", self.warmup_init)):
            if not 0 <= value <= self.lr:
                raise ValueError(f"{flag} must be in [0, --lr {self.lr:g}], got {value:g}")

    def lr_at(self, step: int) -> float:
        """The lr of the optimizer step after `step` steps were taken (Megatron's `get_lr`)."""
        W, D = self.warmup_iters, self.decay_iters
        if W > 0 and step <= W:
            return self.warmup_init + (self.lr - self.warmup_init) * step / W
        if self.style == "constant":
            return self.lr
        if step > D:
            return self.min_lr
        ratio = (step - W) / (D - W) if D > W else 1.0
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.lr - self.min_lr)

    def as_dict(self) -> dict[str, Any]:
        """The fields that decide the lrs (for checkpoints and run.json comparisons)."""
        return asdict(self)

    def describe(self, total_steps: int) -> str:
        """One line for the start of a run: the style, then the lr of the first step, of the warm-up's
        end and of the last of `total_steps` steps."""
        points = [("first step", 0)]
        if self.warmup_iters > 0:
            points.append((f"warm-up end (step {self.warmup_iters})", self.warmup_iters))
        points.append((f"last step ({total_steps - 1})", max(total_steps - 1, 0)))
        values = ", ".join(f"{name} {self.lr_at(step):.3g}" for name, step in points)
        decay = (
            ""
            if self.style == "constant"
            else f", decays to --min-lr {self.min_lr:g} at step {self.decay_iters}"
        )
        return f"lr schedule: {self.style} --lr {self.lr:g}{decay}; {values}"


def resume_mismatch(
    saved: dict[str, Any] | None, stamped_lr: float | None, schedule: LRSchedule, steps_done: int
) -> str | None:
    """Why a checkpoint stamped with schedule `saved` and next-step lr `stamped_lr` (None: computed from
    `saved`) cannot continue under `schedule` after `steps_done` optimizer steps, or None when it can:
    the stamped and the current lr of the next step differ, or the schedules differ in a field that
    changes a later lr (both values named). Two constant schedules ignore the decay fields, and once
    both warm-ups are over the warm-up fields are ignored."""
    if saved is None:
        return None
    try:
        before = LRSchedule(**saved)
    except (TypeError, ValueError) as e:
        return f"the checkpoint's lr schedule stamp {saved!r} is not a schedule ({e})"
    ignored = {"decay_iters", "min_lr"} if before.style == schedule.style == "constant" else set()
    if steps_done >= max(before.warmup_iters, schedule.warmup_iters):
        ignored |= {"warmup_iters", "warmup_init"}  # the warm-up is over on both sides
    fields = [k for k, v in before.as_dict().items() if k not in ignored and v != getattr(schedule, k)]
    now = schedule.lr_at(steps_done)
    then = before.lr_at(steps_done) if stamped_lr is None else stamped_lr
    if not fields and now == then:
        return None
    changed = "; ".join(f"{k} {getattr(before, k)!r} -> {getattr(schedule, k)!r}" for k in fields)
    if now == then:  # the same next lr: the schedules part later
        settled = (
            max(before.decay_iters, schedule.decay_iters, before.warmup_iters, schedule.warmup_iters) + 1
        )
        # past `settled` both lrs are constant (--lr or --min-lr), so a difference shows by then
        later = next(
            (k for k in range(steps_done + 1, settled + 1) if before.lr_at(k) != schedule.lr_at(k)), None
        )
        where = (
            f"; they first differ at step {later} ({before.lr_at(later):.6g} vs {schedule.lr_at(later):.6g})"
            if later is not None
            else ""
        )
        return (
            f"the checkpoint was saved under another lr schedule ({changed}): its next step ({steps_done}) "
            f"trains at lr {now:.6g} under both{where}"
        )
    return (
        f"the checkpoint was saved under another lr schedule ({changed or 'same fields'}): its next step "
        f"({steps_done}) would train at lr {then:.6g}, this run's schedule gives {now:.6g}"
    )
