"""Per-token engine vs trainer log-prob gap of a recorded rollout, recomputed on demand.

A recording holds the engine's per-token log-probs (`rollout_log_probs`), not the trainer's.
The trainer's side is recomputed here with `Actor.compute_log_probs` on the weights the trainer
held when that rollout was trained — the same quantity the run logged as
`train/train_rollout_logprob_abs_diff` (|old log-prob − engine log-prob|, per-sample token mean,
averaged over samples) — and only when those weights are on disk:

- rollout 0 of a fresh run, every rollout of `--debug-rollout-only` or
  `--debug-disable-optimizer` runs: the run's `--hf-checkpoint`;
- rollout N > 0: the checkpoint saved before rollout N (`--save .../iter_<N>`, found through the
  run's `checkpoint` / `resume` events).

Otherwise `weights_for_rollout` says why nothing can be recomputed. CPU, float32 as the run's
`--train-dtype`, the run's temperature and micro-batch split; cheap for small models only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grpolab.core.batch import Sample


@dataclass(frozen=True)
class WeightsSource:
    """Where the trainer's weights for one rollout come from.

    Attributes:
        checkpoint: the run's `--hf-checkpoint` (architecture, tokenizer, initial weights).
        weights: an `iter_<N>` checkpoint directory whose model.safetensors replaces the
            initial weights, or None to use the initial weights.
        description: one line for the page.
    """

    checkpoint: str
    weights: Path | None
    description: str


def _find(path: str, run_dir: Path) -> Path | None:
    p = Path(path)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, run_dir / p, *(d / p for d in run_dir.parents)]
    return next((c for c in candidates if c.exists()), None)


def weights_for_rollout(
    run_json: dict[str, Any], events: list[dict[str, Any]], rollout_id: int, run_dir: Path
) -> WeightsSource | str:
    """The trainer weights that scored `rollout_id`, or a sentence saying why they are not available."""
    config = run_json.get("config") or {}
    model = config.get("model") or {}
    debug = config.get("debug") or {}
    hf = model.get("hf_checkpoint")
    if not hf:
        return "run.json names no --hf-checkpoint"
    found = _find(str(hf), run_dir)
    if found is None:
        return f"--hf-checkpoint {hf} is not on this machine"
    if debug.get("load_debug_rollout_data") or debug.get("debug_train_only"):
        return "this run trained on recordings; their engine weights are another run's"
    initial = WeightsSource(str(found), None, f"initial weights of --hf-checkpoint {hf}")
    if debug.get("debug_rollout_only") or debug.get("debug_disable_optimizer"):
        return initial
    resumed = [e for e in events if e.get("event") == "resume" and e.get("found")]
    if rollout_id == 0 and not resumed:
        return initial
    for ev in events:
        saved_before = (ev.get("event") == "checkpoint" and ev.get("rollout_id") == rollout_id - 1) or (
            ev.get("event") == "resume" and ev.get("found") and ev.get("next_rollout_id") == rollout_id
        )
        if saved_before and ev.get("path"):
            ckpt = _find(str(ev["path"]), run_dir)
            if ckpt is not None and (ckpt / "model.safetensors").is_file():
                return WeightsSource(
                    str(found), ckpt, f"checkpoint {ckpt.name} (saved before rollout {rollout_id})"
                )
    return (
        f"no checkpoint of the weights before rollout {rollout_id} is on disk "
        f"(the trainer changed them after rollout 0; save with --save-interval 1 to inspect every rollout)"
    )


def token_texts(run_json: dict[str, Any], run_dir: Path, token_ids: list[int]) -> list[str] | None:
    """Each token id decoded alone with the run's tokenizer; None when the checkpoint is not here."""
    hf = ((run_json.get("config") or {}).get("model") or {}).get("hf_checkpoint")
    found = _find(str(hf), run_dir) if hf else None
    if found is None:
        return None
    from grpolab.core.modeling import load_tokenizer

    try:
        tok = load_tokenizer(found)
    except (OSError, ValueError):
        return None
    return [tok.decode([i]) for i in token_ids]


def trainer_log_probs(
    run_json: dict[str, Any], samples: list[Sample], source: WeightsSource
) -> list[np.ndarray]:
    """Recompute the trainer's per-token log-probs (float32 [R] per sample) on CPU."""
    import torch
    from safetensors.torch import load_file

    from grpolab.core.actor import Actor
    from grpolab.core.config import AlgorithmConfig, OptimizerConfig
    from grpolab.core.modeling import parse_dtype

    config = run_json.get("config") or {}
    model_cfg, opt_cfg = config.get("model") or {}, config.get("optimizer") or {}
    rollout_cfg = config.get("rollout") or {}
    gbs = opt_cfg.get("global_batch_size") or len(samples)
    actor = Actor(
        source.checkpoint,
        dtype=parse_dtype(model_cfg.get("train_dtype", "float32"), "--train-dtype"),
        device="cpu",
        optimizer=OptimizerConfig(
            global_batch_size=gbs, micro_batch_size=opt_cfg.get("micro_batch_size", 16)
        ),
        algorithm=AlgorithmConfig(),
        temperature=float(rollout_cfg.get("rollout_temperature", 1.0)),
        build_optimizer=False,
    )
    if source.weights is not None:
        weights = load_file(source.weights / "model.safetensors")
        with torch.no_grad():
            for name, tensor in actor.named_weights():
                tensor.copy_(weights[name])
    return [lp.numpy().astype(np.float32) for lp in actor.compute_log_probs(samples).log_probs]


def sample_mean_abs_gap(
    engine: list[np.ndarray], trainer: list[np.ndarray], masks: list[np.ndarray]
) -> float:
    """Mean over samples of each sample's masked token mean |trainer − engine| (the logged reduction
    under the default sample-mean loss)."""
    per = []
    for e, t, m in zip(engine, trainer, masks):
        denom = max(float(m.sum()), 1.0)
        per.append(float((np.abs(t.astype(np.float64) - e) * m).sum() / denom))
    return float(np.mean(per)) if per else float("nan")
