"""`grpolab replay logprobs`: the trainer-vs-engine log-prob gap of a recorded rollout, and its result file.

A recording holds the engine's per-token log-probs (`rollout_log_probs`), not the trainer's. The
trainer's side is recomputed with `Actor.compute_log_probs` on the weights the trainer held when that
rollout was trained, which gives the quantity the run logged as `train/train_rollout_logprob_abs_diff`
(|old log-prob − engine log-prob| over loss tokens, reduced per optimizer window as the run's loss:
a per-sample token mean averaged over samples, or with `--calculate-per-token-loss` a token mean;
the arithmetic is `replay/logprob_gap.py`). Those weights are:

- rollout 0 of a fresh run, every rollout of `--debug-rollout-only` or `--debug-disable-optimizer`
  runs: the run's `--hf-checkpoint`;
- rollout N > 0: the checkpoint saved before rollout N (`--save .../iter_<N>`, found through the
  run's `checkpoint` / `resume` events).

Otherwise `weights_for_rollout` says why nothing can be recomputed. The recompute runs on CPU in the
run's `--train-dtype` with its temperature, global and micro batch sizes; cheap for small models only.

The result goes to RUN_DIR/logprobs/rollout_<N>.json (one JSON object, written atomically; never
pickle): both sides' per-token log-probs, each sample's mean |gap|, the gap of each optimizer step
and of the whole rollout, the weights used and the time. `write_result` and `read_result` are the only
code that knows its layout; the UI reads it through `RunStore.read_logprobs`. Importing this module imports neither torch
nor transformers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from grpolab.core.atomic import atomic_write_bytes
from grpolab.replay.logprob_gap import reduce_gap, sample_gaps, step_windows
from grpolab.rundir.reader import read_events, read_run_meta
from grpolab.rundir.recordings import locate, recorded_rollouts

if TYPE_CHECKING:
    from grpolab.core.batch import Sample
    from grpolab.core.config import Config

RESULT_FORMAT = "grpolab.replay.logprobs"
RESULT_VERSION = 1
GAP_KEY = "train/train_rollout_logprob_abs_diff"
"""The metric the run logged for the same quantity, one value per optimizer step."""


class LogprobsError(ValueError):
    """A rollout whose gap cannot be recomputed, or a result file that cannot be read (names the file)."""


@dataclass(frozen=True)
class WeightsSource:
    """Where the trainer's weights for one rollout come from.

    Attributes:
        checkpoint: the run's `--hf-checkpoint` as found here (architecture, tokenizer, initial weights).
        weights: an `iter_<N>` checkpoint directory whose model.safetensors replaces the initial
            weights, or None to use the initial weights.
        description: one line saying which weights these are.
    """

    checkpoint: str
    weights: str | None
    description: str


@dataclass(frozen=True)
class SampleGap:
    """One answer of the rollout.

    Attributes:
        index: the sample's index in the rollout (`Sample.index`).
        loss_tokens: response tokens that count in the loss (sum of the loss mask).
        mean_abs_gap: masked token mean of |trainer − engine| log-prob (nats; 0 with no loss token).
        trainer_log_probs / engine_log_probs: float32 [R] per response token, natural log.
    """

    index: int
    loss_tokens: int
    mean_abs_gap: float
    trainer_log_probs: np.ndarray
    engine_log_probs: np.ndarray


@dataclass(frozen=True)
class LogprobsResult:
    """The content of RUN_DIR/logprobs/rollout_<N>.json.

    Attributes:
        rollout_id: the recorded rollout; recording: its file as read.
        weights: the trainer weights used; created: unix seconds.
        reduction: "sample_mean" or "token_mean" (the run's loss reduction, `--calculate-per-token-loss`).
        mean_abs_gap: the whole rollout reduced that way (nats).
        steps: (train step, gap of that optimizer window) as the run logged `GAP_KEY`; empty when the
            recorded sample count does not split into the run's windows.
        samples: one `SampleGap` per answer, in recording order.
    """

    rollout_id: int
    recording: str
    weights: WeightsSource
    created: float
    reduction: str
    mean_abs_gap: float
    steps: list[tuple[int, float]]
    samples: list[SampleGap]


def result_path(run_dir: str | Path, rollout_id: int) -> Path:
    """RUN_DIR/logprobs/rollout_<N>.json."""
    return Path(run_dir) / "logprobs" / f"rollout_{rollout_id}.json"


def _run_config(run_dir: Path) -> tuple[Config, int]:
    """(the run's config, its world size) from run.json through the run-directory reader.

    Raises:
        RunDirError: run.json is missing or unreadable. LogprobsError: its config does not parse here.
    """
    meta = read_run_meta(run_dir)
    if meta.config is None:
        raise LogprobsError(f"{run_dir / 'run.json'}: {meta.config_error}")
    return meta.config, meta.world_size or 1


def weights_for_rollout(
    config: Config, events: list[dict[str, Any]], rollout_id: int, run_dir: Path
) -> WeightsSource | str:
    """The trainer weights that scored `rollout_id`, or a sentence saying why they are not available."""
    hf = config.model.hf_checkpoint
    found = locate(run_dir, hf)
    if found is None:
        return f"--hf-checkpoint {hf} is not on this machine"
    debug = config.debug
    if debug.load_debug_rollout_data or debug.debug_train_only:
        return "this run trained on recordings; their engine weights are another run's"
    initial = WeightsSource(str(found), None, f"initial weights of --hf-checkpoint {hf}")
    if debug.debug_rollout_only or debug.debug_disable_optimizer:
        return initial
    resumed = [e for e in events if e.get("event") == "resume" and e.get("found")]
    if rollout_id == 0 and not resumed:
        return initial
    for ev in events:
        saved_before = (ev.get("event") == "checkpoint" and ev.get("rollout_id") == rollout_id - 1) or (
            ev.get("event") == "resume" and ev.get("found") and ev.get("next_rollout_id") == rollout_id
        )
        if saved_before and ev.get("path"):
            ckpt = locate(run_dir, str(ev["path"]))
            if ckpt is not None and (ckpt / "model.safetensors").is_file():
                return WeightsSource(
                    str(found), str(ckpt), f"checkpoint {ckpt.name} (saved before rollout {rollout_id})"
                )
    return (
        f"no checkpoint of the weights before rollout {rollout_id} is on disk "
        f"(the trainer changed them after rollout 0; save with --save-interval 1 to inspect every rollout)"
    )


def recording_of(config: Config, events: list[dict[str, Any]], rollout_id: int, run_dir: Path) -> Path:
    """The .grz recording of `rollout_id` by the rule the UI lists them with
    (`rundir.recordings.recorded_rollouts` with the run's `--save-debug-rollout-data` template).

    Raises:
        LogprobsError: the run recorded no such rollout, or the file is not here.
    """
    template = config.debug.save_debug_rollout_data
    found = recorded_rollouts(run_dir, events, template).get(rollout_id)
    if found is not None:
        return found
    named = [
        str(e["path"])
        for e in events
        if e.get("event") == "rollout_recorded" and e.get("rollout_id") == rollout_id and e.get("path")
    ]
    if template:
        named.append(template.replace("{rollout_id}", str(rollout_id)))
    recorded = sorted({e["rollout_id"] for e in events if e.get("event") == "rollout_recorded"})
    if not named:
        raise LogprobsError(
            f"{run_dir}: rollout {rollout_id} was not recorded (record with --save-debug-rollout-data)"
        )
    raise LogprobsError(
        f"{run_dir}: the recording of rollout {rollout_id} ({named[0]}) is not on this machine "
        f"(the run recorded rollouts {recorded})"
    )


# ---------------------------------------------------------------------------------- recompute
def trainer_log_probs(config: Config, samples: list[Sample], source: WeightsSource) -> list[np.ndarray]:
    """The trainer's per-token log-probs of `samples` (float32 [R] each), on CPU, with the run's
    `--train-dtype`, temperature, global and micro batch sizes and the weights of `source`.

    Raises:
        LogprobsError: the checkpoint's model.safetensors misses a weight of the model.
        OSError / ValueError: the model cannot be loaded (`load_causal_lm`).
    """
    import torch
    from safetensors.torch import load_file

    from grpolab.core.actor import Actor
    from grpolab.core.modeling import parse_dtype

    actor = Actor(
        source.checkpoint,
        dtype=parse_dtype(config.model.train_dtype, "--train-dtype"),
        device="cpu",
        optimizer=config.optimizer,
        algorithm=config.algorithm,
        temperature=config.rollout.rollout_temperature,
        build_optimizer=False,
        with_reference=False,  # only the policy's log-probs are computed: no reference copy in memory
        train_forward=config.model.train_forward,
    )
    if source.weights is not None:
        file = Path(source.weights) / "model.safetensors"
        weights = load_file(file)
        with torch.no_grad():
            for name, tensor in actor.named_weights():
                if name not in weights:
                    raise LogprobsError(f"{file}: no weight {name!r}; not a checkpoint of this model")
                tensor.copy_(weights[name])
    return [lp.numpy().astype(np.float32) for lp in actor.compute_log_probs(samples).log_probs]


def check_output(out: Path, force: bool) -> None:
    """Refuse, before any computing, a result path that cannot be written.

    Raises:
        LogprobsError: `out`'s folder (RUN_DIR/logprobs) exists and is not a directory; `out` is a
            directory; `out` exists and not `force`.
    """
    if out.parent.exists() and not out.parent.is_dir():
        raise LogprobsError(
            f"{out.parent} is not a directory; expected the folder of the result files (move it away)"
        )
    if out.is_dir():
        raise LogprobsError(f"{out} is a directory; expected the result file of the rollout (move it away)")
    if out.exists() and not force:
        raise LogprobsError(f"{out} already exists; pass --force to recompute it")


def recompute(
    run_dir: str | Path, rollout_id: int, *, force: bool = False, progress: Callable[[str], None] = print
) -> tuple[LogprobsResult, Path]:
    """Recompute the trainer side of recorded rollout `rollout_id` and write the result file.

    Args:
        progress: called with one line per phase (loading, scoring, writing).

    Returns:
        the result and the file written (`result_path`).

    Raises:
        LogprobsError: the result path cannot be written or exists and not `force` (`check_output`);
            no recording; a recording whose header names another rollout; the weights are not on disk
            (the message says why); run.json's config does not parse here.
        RunDirError: run.json is missing or unreadable. RecordingError: a damaged recording.
        OSError: files that cannot be read or written.
    """
    from grpolab.replay.recording import load_rollout

    run_dir = Path(run_dir)
    out = result_path(run_dir, rollout_id)
    check_output(out, force)
    (config, world_size), events = _run_config(run_dir), read_events(run_dir)
    recording = recording_of(config, events, rollout_id, run_dir)
    source = weights_for_rollout(config, events, rollout_id, run_dir)
    if isinstance(source, str):
        raise LogprobsError(f"{run_dir}: cannot recompute rollout {rollout_id}: {source}")
    progress(f"[1/3] reading {recording}")
    loaded = load_rollout(recording)
    if loaded.rollout_id != rollout_id:
        raise LogprobsError(
            f"{recording}: its header says rollout {loaded.rollout_id!r}, not --rollout {rollout_id} "
            f"(a mislabelled or renamed recording); nothing computed"
        )
    samples = loaded.samples
    progress(f"[2/3] loading the {source.description} and scoring {len(samples)} samples on CPU")
    trainer = trainer_log_probs(config, samples, source)
    engine = [s.rollout_log_probs.numpy().astype(np.float32) for s in samples]
    result = gap_result(config, world_size, rollout_id, str(recording), source, samples, engine, trainer)
    progress(f"[3/3] writing {out}")
    write_result(out, result)
    return result, out


def gap_result(
    config: Config,
    world_size: int,
    rollout_id: int,
    recording: str,
    source: WeightsSource,
    samples: list[Sample],
    engine: list[np.ndarray],
    trainer: list[np.ndarray],
) -> LogprobsResult:
    """Assemble a `LogprobsResult` from both sides' per-token log-probs (float32 [R] per sample) of a
    rollout trained by `world_size` ranks."""
    reduction = "token_mean" if config.algorithm.calculate_per_token_loss else "sample_mean"
    masks = [s.loss_mask.numpy() for s in samples]
    sums, counts = sample_gaps(engine, trainer, masks)
    gbs = config.optimizer.global_batch_size or len(samples)
    windows = step_windows(len(samples), gbs, world_size)
    first = rollout_id * len(windows)
    return LogprobsResult(
        rollout_id=rollout_id,
        recording=recording,
        weights=source,
        created=time.time(),
        reduction=reduction,
        mean_abs_gap=reduce_gap(sums, counts, reduction),
        steps=[(first + k, reduce_gap(sums[w], counts[w], reduction)) for k, w in enumerate(windows)],
        samples=[
            SampleGap(s.index, int(counts[i]), float(sums[i] / max(counts[i], 1.0)), trainer[i], engine[i])
            for i, s in enumerate(samples)
        ],
    )


# ---------------------------------------------------------------------------------- result file
def write_result(path: str | Path, result: LogprobsResult) -> None:
    """Write `result` atomically as one line of JSON (log-probs as float lists: float32 round-trips
    exactly through JSON's float64)."""
    obj = {
        "format": RESULT_FORMAT,
        "version": RESULT_VERSION,
        "rollout_id": result.rollout_id,
        "recording": result.recording,
        "weights": asdict(result.weights),
        "created": result.created,
        "reduction": result.reduction,
        "mean_abs_gap": result.mean_abs_gap,
        "steps": [{"step": step, "mean_abs_gap": gap} for step, gap in result.steps],
        "samples": [
            {
                "index": s.index,
                "loss_tokens": s.loss_tokens,
                "mean_abs_gap": s.mean_abs_gap,
                "trainer_log_probs": s.trainer_log_probs.astype(np.float64).tolist(),
                "engine_log_probs": s.engine_log_probs.astype(np.float64).tolist(),
            }
            for s in result.samples
        ],
    }
    atomic_write_bytes(path, (json.dumps(obj) + "\n").encode())


def _floats(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, list) or not all(isinstance(v, int | float) for v in value):
        raise LogprobsError(f"{where}: expected a list of numbers")
    return np.asarray(value, dtype=np.float32)


def _sample(obj: Any, where: str) -> SampleGap:
    if not isinstance(obj, dict):
        raise LogprobsError(f"{where}: expected an object")
    trainer = _floats(obj.get("trainer_log_probs"), f"{where}.trainer_log_probs")
    engine = _floats(obj.get("engine_log_probs"), f"{where}.engine_log_probs")
    if len(trainer) != len(engine):
        raise LogprobsError(f"{where}: {len(trainer)} trainer vs {len(engine)} engine log-probs")
    return SampleGap(int(obj["index"]), int(obj["loss_tokens"]), float(obj["mean_abs_gap"]), trainer, engine)


def read_result(path: str | Path) -> LogprobsResult:
    """Read a file written by `write_result`.

    Raises:
        LogprobsError: not JSON, another format or version, or a missing / mis-typed field (the
            message names the file and the field).
        OSError: the file cannot be read.
    """
    path = Path(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise LogprobsError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != RESULT_FORMAT:
        raise LogprobsError(f"{path}: not a {RESULT_FORMAT} file")
    if obj.get("version") != RESULT_VERSION:
        raise LogprobsError(f"{path}: version {obj.get('version')!r}, this grpolab reads {RESULT_VERSION}")
    try:
        samples = obj["samples"]
        return LogprobsResult(
            rollout_id=int(obj["rollout_id"]),
            recording=str(obj["recording"]),
            weights=WeightsSource(**obj["weights"]),
            created=float(obj["created"]),
            reduction=str(obj["reduction"]),
            mean_abs_gap=float(obj["mean_abs_gap"]),
            steps=[(int(s["step"]), float(s["mean_abs_gap"])) for s in obj["steps"]],
            samples=[_sample(s, f"{path}: samples[{i}]") for i, s in enumerate(samples)],
        )
    except LogprobsError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise LogprobsError(f"{path}: missing or mis-typed field ({type(e).__name__}: {e})") from None


def token_texts(run_dir: str | Path, token_ids: list[int]) -> list[str] | None:
    """Each token id decoded alone with the run's tokenizer (`--hf-checkpoint`); None when run.json's
    config does not parse here or the checkpoint is not on this machine."""
    run_dir = Path(run_dir)
    try:
        config, _ = _run_config(run_dir)
    except ValueError:
        return None
    found = locate(run_dir, config.model.hf_checkpoint)
    if found is None:
        return None
    from grpolab.core.modeling import load_tokenizer

    try:
        tok = load_tokenizer(found)
    except (OSError, ValueError):
        return None
    return [tok.decode([i]) for i in token_ids]
