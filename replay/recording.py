"""Rollout <-> `.grz` recording: what a rollout recording holds and how Samples map onto arrays.

Header (JSON): kind, format_version, rollout_id (int, or "eval_N"), weight_version, run_seed,
run_id and run_dir (the recording run's identity, `RUN_DIR/run.json`'s run_id and its --run-dir;
absent from recordings made before they existed, read as ""), sampler settings, model/tokenizer fingerprints, chat template hash, train_config (the config
fields that change training), created (unix seconds), num_samples, extra (free-form notes, e.g.
"seeds unknown" for imports), and per-sample text fields and metadata (`samples` object).

Arrays (N samples, T = total response tokens, P = total prompt tokens, K = total kept ids):
    prompt_offsets int64 [N+1], prompt_ids int32|int64 [P]
    response_offsets int64 [N+1], response_ids int32|int64 [T]
    rollout_log_probs float32 [T]; loss_mask uint8 [T] (all 0/1) or float32 [T]
    reward float64 [N], advantage float64 [N]
    index, prompt_index, group_index, sample_index, weight_version int64 [N]; seed uint64 [N]
    finish_reason uint8 [N] (0 "stop", 1 "length")
    has_kept bool [N]; kept_offsets int64 [T+1] (per response token, into kept_ids); kept_ids int32|int64 [K]
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpolab.core.batch import Sample
from grpolab.replay.fingerprints import FINGERPRINT_FIELDS
from grpolab.replay.format import FORMAT_VERSION, RecordingError, read_container, write_container
from grpolab.replay.paths import check_rollout_id

KIND = "grpolab.rollout"
FINISH_CODES: dict[str, int] = {"stop": 0, "length": 1}
FINISH_NAMES: dict[int, str] = {v: k for k, v in FINISH_CODES.items()}
TEXT_FIELDS = ("prompt_text", "response_text", "label", "metadata")
_PER_SAMPLE_INT = ("index", "prompt_index", "group_index", "sample_index", "weight_version")


@dataclass(kw_only=True)
class RolloutRecording:
    """One recorded rollout: header fields plus the rebuilt samples.

    Attributes:
        rollout_id: training rollout id (int) or an eval id string such as "eval_3".
        weight_version: engine weight version the rollout was generated with.
        run_seed: the run's `--seed`.
        run_id: the recording run's id (run.json's run_id); "" when unknown (older recordings, imports).
        run_dir: the recording run's `--run-dir` as it gave it; "" when unknown.
        seeds: uint64 [N], each sample's sampling seed (0 where unknown, see `extra`).
        sampler: temperature, top_p, top_k, max_new_tokens (as recorded).
        model_fingerprint / tokenizer_fingerprint / chat_template_hash: hex digests ("" if unknown).
        train_config: config fields that change training, as recorded.
        created: unix time (seconds) of the write.
        samples: the rollout, `Sample` objects with tensors of the trainer's dtypes.
        extra: free-form notes (e.g. {"source": "miles", "seeds_known": False}).
    """

    rollout_id: int | str
    weight_version: int
    run_seed: int
    seeds: np.ndarray
    sampler: dict[str, Any]
    model_fingerprint: str
    tokenizer_fingerprint: str
    chat_template_hash: str
    train_config: dict[str, Any]
    created: float
    samples: list[Sample]
    format_version: int = FORMAT_VERSION
    run_id: str = ""
    run_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprints(self) -> dict[str, str]:
        """{model_fingerprint, tokenizer_fingerprint, chat_template_hash} for `compare_fingerprints`."""
        return {k: getattr(self, k) for k in FINGERPRINT_FIELDS}


# ----------------------------------------------------------------------------------- save/load
def _id_array(values: list[int]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
        return arr
    return arr.astype(np.int32)


def _offsets(lengths: list[int]) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _flat(tensors: list[torch.Tensor], dtype: torch.dtype) -> np.ndarray:
    if not tensors:
        return np.zeros(0, dtype=torch.empty(0, dtype=dtype).numpy().dtype)
    return torch.cat([t.detach().reshape(-1).to("cpu", dtype) for t in tensors]).numpy()


def rollout_arrays(samples: list[Sample]) -> tuple[dict[str, np.ndarray], dict[str, list[Any]]]:
    """Map samples to (named arrays, per-sample JSON fields); see the module docstring for names.

    Raises:
        ValueError: a sample's log-prob / loss-mask / kept-set length differs from its response
            length, an unknown finish reason, a seed outside [0, 2**64), or metadata that is not
            JSON-serializable (the sample index is named).
    """
    for i, s in enumerate(samples):
        R = len(s.response_ids)
        counts = {"rollout_log_probs": s.rollout_log_probs.numel(), "loss_mask": s.loss_mask.numel()}
        if s.kept_token_ids is not None:
            counts["kept_token_ids"] = len(s.kept_token_ids)
        problems = [f"{k} has {c} entries for {R} response tokens" for k, c in counts.items() if c != R]
        if s.finish_reason not in FINISH_CODES:
            problems.append(f"finish_reason {s.finish_reason!r} is not one of {list(FINISH_CODES)}")
        if not 0 <= s.seed < 2**64:
            problems.append(f"seed {s.seed} is outside [0, 2**64)")
        try:
            json.dumps(s.metadata)
        except (TypeError, ValueError) as e:
            problems.append(f"metadata is not JSON-serializable ({e})")
        if problems:
            raise ValueError(f"sample {i}: " + "; ".join(problems))
    mask = _flat([s.loss_mask for s in samples], torch.float32)
    kept_lengths: list[int] = []
    kept_flat: list[torch.Tensor] = []
    for s in samples:
        if s.kept_token_ids is None:
            kept_lengths.extend([0] * len(s.response_ids))
        else:
            kept_lengths.extend(k.numel() for k in s.kept_token_ids)
            kept_flat.extend(s.kept_token_ids)
    arrays = {
        "prompt_offsets": _offsets([len(s.prompt_ids) for s in samples]),
        "prompt_ids": _id_array([t for s in samples for t in s.prompt_ids]),
        "response_offsets": _offsets([len(s.response_ids) for s in samples]),
        "response_ids": _id_array([t for s in samples for t in s.response_ids]),
        "rollout_log_probs": _flat([s.rollout_log_probs for s in samples], torch.float32),
        "loss_mask": mask.astype(np.uint8) if np.isin(mask, (0.0, 1.0)).all() else mask,
        "reward": np.asarray([float(s.reward) for s in samples], dtype=np.float64),
        "advantage": np.asarray([float(s.advantage) for s in samples], dtype=np.float64),
        **{k: np.asarray([getattr(s, k) for s in samples], dtype=np.int64) for k in _PER_SAMPLE_INT},
        "seed": np.asarray([s.seed for s in samples], dtype=np.uint64),
        "finish_reason": np.asarray([FINISH_CODES[s.finish_reason] for s in samples], dtype=np.uint8),
        "has_kept": np.asarray([s.kept_token_ids is not None for s in samples], dtype=bool),
        "kept_offsets": _offsets(kept_lengths),
        "kept_ids": _id_array(_flat(kept_flat, torch.int64)) if kept_flat else np.zeros(0, np.int32),
    }
    return arrays, {k: [getattr(s, k) for s in samples] for k in TEXT_FIELDS}


def save_rollout(path: str | Path, samples: list[Sample], *, level: int = 3, **fields: Any) -> int:
    """Write one rollout as a `.grz` recording (atomic: temp file + rename); return the bytes written.

    `fields` are `rollout_container`'s keyword arguments; `level` is the zstd level. Raises what it raises.
    """
    return write_container(path, *rollout_container(samples, **fields), level=level)


def rollout_container(
    samples: list[Sample],
    *,
    rollout_id: int | str,
    weight_version: int,
    run_seed: int,
    sampler: dict[str, Any],
    fingerprints: dict[str, str],
    train_config: dict[str, Any],
    run_id: str = "",
    run_dir: str = "",
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One rollout as a recording's (header, arrays), ready for `format.encode_container` / `write_container`.

    Args:
        samples: the rollout in order; rewards and advantages are stored as they are now; text
            fields and metadata go to the JSON header (tuples come back as lists, keys as str).
        rollout_id: int id, or "eval_N" for an eval rollout.
        weight_version: engine weight version used to generate the rollout.
        run_seed: the run's `--seed`.
        sampler: temperature, top_p, top_k, max_new_tokens (any JSON-serializable dict).
        fingerprints: any of model_fingerprint, tokenizer_fingerprint, chat_template_hash (missing -> "").
        train_config: config fields that change training (JSON-serializable).
        run_id / run_dir: the recording run's identity ("" when there is no run, e.g. an import).
        extra: free-form JSON-serializable notes stored under `extra`.

    Raises:
        ValueError: a bad rollout id, unknown fingerprint keys, or a sample `rollout_arrays` rejects.
        TypeError: header fields that are not JSON-serializable.
    """
    check_rollout_id(rollout_id)
    unknown = set(fingerprints) - set(FINGERPRINT_FIELDS)
    if unknown:
        raise ValueError(f"unknown fingerprint fields {sorted(unknown)}; expected {list(FINGERPRINT_FIELDS)}")
    arrays, text = rollout_arrays(samples)
    now = time.time()
    header = {
        "kind": KIND,
        "format_version": FORMAT_VERSION,
        "rollout_id": rollout_id,
        "weight_version": int(weight_version),
        "run_seed": int(run_seed),
        "run_id": str(run_id),
        "run_dir": str(run_dir),
        "sampler": dict(sampler),
        **{k: str(fingerprints.get(k, "")) for k in FINGERPRINT_FIELDS},
        "train_config": dict(train_config),
        "created": now,
        "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "num_samples": len(samples),
        "extra": dict(extra or {}),
        "samples": text,
    }
    return header, arrays


HEADER_FIELDS = (
    "rollout_id",
    "weight_version",
    "run_seed",
    "sampler",
    "train_config",
    "num_samples",
    "samples",
)
PER_SAMPLE_ARRAYS = ("reward", "advantage", *_PER_SAMPLE_INT, "seed", "finish_reason", "has_kept")
FLAT_ARRAYS = ("prompt_ids", "response_ids", "rollout_log_probs", "loss_mask", "kept_ids")
# offsets array -> (array it indexes, what one entry stands for)
OFFSET_ARRAYS = {
    "prompt_offsets": "prompt_ids",
    "response_offsets": "response_ids",
    "kept_offsets": "kept_ids",
}


def _validate(header: dict[str, Any], arrays: dict[str, np.ndarray], name: str) -> int:
    """Check a rollout recording's header and arrays are complete and consistent; return N."""

    def check(cond: bool, msg: str) -> None:
        if not cond:
            raise RecordingError(f"{name}: {msg}")

    check(
        header.get("kind") == KIND,
        f"not a rollout recording (kind {header.get('kind')!r}, expected {KIND!r})",
    )
    check(not (missing := [k for k in HEADER_FIELDS if k not in header]), f"header lacks {missing}")
    n = header["num_samples"]
    check(type(n) is int and n >= 0, f"num_samples {n!r} is not an int >= 0")
    for k, types in (("weight_version", int), ("run_seed", int), ("sampler", dict), ("train_config", dict)):
        check(isinstance(header[k], types), f"header {k} {header[k]!r} must be of type {types.__name__}")
    for k in ("run_id", "run_dir"):  # optional: recordings made before run identities lack them
        check(isinstance(header.get(k, ""), str), f"header {k} {header.get(k)!r} must be a string")
    try:
        check_rollout_id(header["rollout_id"])
    except ValueError as e:
        check(False, f"header {e}")
    need = [*OFFSET_ARRAYS, *FLAT_ARRAYS, *PER_SAMPLE_ARRAYS]
    check(not (absent := [k for k in need if k not in arrays]), f"missing arrays {absent}")
    for k in FLAT_ARRAYS:
        check(arrays[k].ndim == 1, f"array {k!r} must be 1-d, has shape {arrays[k].shape}")
    T = arrays["response_ids"].shape[0]
    lengths = {k: n for k in PER_SAMPLE_ARRAYS} | {"rollout_log_probs": T, "loss_mask": T}
    lengths |= {"prompt_offsets": n + 1, "response_offsets": n + 1, "kept_offsets": T + 1}
    for k, want in lengths.items():
        check(arrays[k].shape == (want,), f"array {k!r} has shape {arrays[k].shape}, expected ({want},)")
    for k, target in OFFSET_ARRAYS.items():
        off, total = arrays[k], arrays[target].shape[0]
        check(off[0] == 0 and off[-1] == total, f"array {k!r} must run from 0 to {total} (len of {target!r})")
        check(bool((np.diff(off) >= 0).all()), f"array {k!r} is not non-decreasing")
    bad = sorted(set(arrays["finish_reason"].tolist()) - set(FINISH_NAMES))
    check(not bad, f"unknown finish_reason codes {bad} (known: {FINISH_NAMES})")
    text = header["samples"]
    for k in TEXT_FIELDS:
        ok = isinstance(text, dict) and isinstance(text.get(k), list) and len(text[k]) == n
        check(ok, f"header samples.{k} must be a list of {n} entries")
    return n


def verify_rollout(path: str | Path) -> dict[str, Any]:
    """Check a whole recording (both checksums, the array table, the header) without rebuilding its
    samples; return its header. For start-up checks: what `load_rollout` would reject, found before
    the first rollout.

    Raises:
        RecordingError: see `load_rollout`.
    """
    header, arrays = read_container(path)
    _validate(header, arrays, str(path))
    return header


def load_rollout(path: str | Path) -> RolloutRecording:
    """Read a `.grz` rollout recording and rebuild its samples exactly.

    Tensors: rollout_log_probs float32 [R], loss_mask float32 [R], kept_token_ids a list of
    int64 tensors (one per response token) or None; token ids are Python int lists.

    Raises:
        RecordingError: anything `read_container` rejects, a container that is not a rollout
            recording, or a missing / mis-shaped array or header field (named in the message).
    """
    return recording_from_container(*read_container(path), name=str(path))


def recording_from_container(
    header: dict[str, Any], arrays: dict[str, np.ndarray], *, name: str
) -> RolloutRecording:
    """The recording a decoded container holds (`load_rollout` without the file; `name` goes into errors).

    Raises:
        RecordingError: not a rollout recording, or a missing / mis-shaped array or header field.
    """
    n = _validate(header, arrays, name)
    text = header["samples"]
    p_off, r_off, k_list = (arrays[k].tolist() for k in OFFSET_ARRAYS)
    prompt_ids, response_ids = arrays["prompt_ids"].tolist(), arrays["response_ids"].tolist()
    logp = torch.from_numpy(arrays["rollout_log_probs"].astype(np.float32, copy=False))
    mask = torch.from_numpy(arrays["loss_mask"].astype(np.float32))
    kept_ids = torch.from_numpy(arrays["kept_ids"].astype(np.int64))
    ints = {k: arrays[k].tolist() for k in _PER_SAMPLE_INT}
    seeds, finish = arrays["seed"].tolist(), arrays["finish_reason"].tolist()
    rewards, advs, has_kept = (arrays[k].tolist() for k in ("reward", "advantage", "has_kept"))
    samples = []
    for i in range(n):
        a, b = r_off[i], r_off[i + 1]
        kept = [kept_ids[k_list[t] : k_list[t + 1]].clone() for t in range(a, b)] if has_kept[i] else None
        samples.append(
            Sample(
                **{k: ints[k][i] for k in _PER_SAMPLE_INT},
                seed=seeds[i],
                prompt_ids=prompt_ids[p_off[i] : p_off[i + 1]],
                response_ids=response_ids[a:b],
                rollout_log_probs=logp[a:b].clone(),
                loss_mask=mask[a:b].clone(),
                finish_reason=FINISH_NAMES[finish[i]],
                prompt_text=text["prompt_text"][i],
                response_text=text["response_text"][i],
                label=text["label"][i],
                kept_token_ids=kept,
                reward=rewards[i],
                advantage=advs[i],
                metadata=text["metadata"][i],
            )
        )
    return RolloutRecording(
        format_version=int(header.get("format_version", FORMAT_VERSION)),
        rollout_id=header["rollout_id"],
        weight_version=header["weight_version"],
        run_seed=header["run_seed"],
        run_id=header.get("run_id", ""),
        run_dir=header.get("run_dir", ""),
        seeds=arrays["seed"],
        sampler=header["sampler"],
        model_fingerprint=header.get("model_fingerprint", ""),
        tokenizer_fingerprint=header.get("tokenizer_fingerprint", ""),
        chat_template_hash=header.get("chat_template_hash", ""),
        train_config=header["train_config"],
        created=float(header.get("created", 0.0)),
        samples=samples,
        extra=header.get("extra", {}),
    )
