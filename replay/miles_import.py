"""Import Miles / slime rollout dumps (`--save-debug-rollout-data` `.pt` files) as grpolab recordings.

A Miles dump is `torch.save({"rollout_id": int, "metadata": dict, "samples": [dict, ...]})` (slime's
lacks `metadata`). It is loaded ONLY with `torch.load(weights_only=True)`: a file that needs
arbitrary classes unpickled (dataclasses, numpy arrays, enums) is refused, never executed.

What an import cannot know is filled with neutral values and noted in the header's `extra`:
per-sample seeds and the run seed are 0 (`seeds_known: false`), advantages are 0 (recompute from
rewards), `prompt_index` copies `group_index`, fingerprints are empty.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from grpolab.core.batch import Sample
from grpolab.core.rewards import reward_value
from grpolab.core.safe_load import UnreadableFileError, UnsafeFileError, load_pt
from grpolab.replay.format import RecordingError
from grpolab.replay.paths import check_rollout_id
from grpolab.replay.recording import save_rollout

REQUIRED = ("tokens", "response_length", "rollout_log_probs", "reward", "status", "group_index", "index")
STATUS_TO_FINISH = {"completed": "stop", "truncated": "length", "aborted": "length", "failed": "length"}


def load_miles_pt(path: str | Path) -> dict[str, Any]:
    """`torch.load(path, weights_only=True, map_location="cpu")` of a Miles dump, with clear errors.

    Returns:
        The dump dict (has a "samples" list).

    Raises:
        RecordingError: no such file; the file needs unpickling of classes beyond plain
            containers and tensors (the classes are named; grpolab refuses to unpickle them);
            not a torch.save file; or the top level is not a dict with a "samples" list.
    """
    path = Path(path)
    if not path.is_file():
        raise RecordingError(f"{path}: no such Miles recording")
    try:
        obj = load_pt(path, map_location="cpu")
    except (UnsafeFileError, UnreadableFileError) as e:
        raise RecordingError(str(e)) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("samples"), list):
        got = type(obj).__name__ if not isinstance(obj, dict) else f"dict with keys {sorted(map(str, obj))}"
        raise RecordingError(
            f"{path}: expected a Miles dump dict {{rollout_id, metadata, samples: [...]}}, got {got}"
        )
    return obj


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return repr(v)


def _int_list(v: Any, where: str) -> list[int]:
    if isinstance(v, torch.Tensor):
        if v.dim() != 1 or v.is_floating_point() or v.is_complex():
            raise RecordingError(
                f"{where} must be a 1-d integer tensor, got {v.dtype} of shape {tuple(v.shape)}"
            )
        return v.tolist()
    if not isinstance(v, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise RecordingError(f"{where} must be a list of ints or a 1-d integer tensor")
    return list(v)


def _float_tensor(v: Any, where: str) -> torch.Tensor:
    try:
        t = torch.as_tensor(v, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        raise RecordingError(f"{where} must be a list of numbers or a tensor ({e})") from None
    if t.dim() != 1:
        raise RecordingError(f"{where} must be 1-d, got shape {tuple(t.shape)}")
    return t.clone()


def _scalar_int(v: Any, where: str) -> int:
    if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point():
        v = v.item()
    if not isinstance(v, int) or isinstance(v, bool):
        raise RecordingError(f"{where} must be an int, got {v!r}")
    return v


def _reward(v: Any, where: str, reward_key: str | None) -> float:
    """The trainer's own dict-reward reduction (`rewards.reward_value`), failing as a RecordingError."""
    try:
        return reward_value(v, reward_key, where=where)
    except ValueError as e:
        raise RecordingError(str(e)) from None


def _finish(v: Any, where: str) -> str:
    status = str(v).rsplit(".", 1)[-1].lower()  # "Status.COMPLETED" -> "completed"
    if status not in STATUS_TO_FINISH:
        raise RecordingError(
            f"{where} {v!r} is not one of {sorted(STATUS_TO_FINISH)} (a pending sample was never generated)"
        )
    return STATUS_TO_FINISH[status]


def _weight_version(v: Any) -> int:
    for item in reversed(list(v or [])):
        try:
            return int(item)
        except (TypeError, ValueError):
            continue
    return 0


def _text(v: Any) -> str:
    if v is None:
        return ""
    return v if isinstance(v, str) else json.dumps(_jsonable(v), ensure_ascii=False)


def _response(d: dict[str, Any], n_tokens: int, where: str) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(response length R, float32 [R] rollout log-probs, float32 [R] loss mask) of one Miles sample."""
    R = _scalar_int(d["response_length"], f"{where}: response_length")
    if not 0 <= R < n_tokens:
        raise RecordingError(
            f"{where}: response_length {R} must be in [0, {n_tokens}) for {n_tokens} tokens (prompt must be non-empty)"
        )
    logp = _float_tensor(d["rollout_log_probs"], f"{where}: rollout_log_probs")
    if logp.numel() != R:
        raise RecordingError(
            f"{where}: rollout_log_probs has {logp.numel()} values but response_length is {R}"
        )
    mask = (
        torch.ones(R) if d.get("loss_mask") is None else _float_tensor(d["loss_mask"], f"{where}: loss_mask")
    )
    if mask.numel() != R:
        raise RecordingError(f"{where}: loss_mask has {mask.numel()} values but response_length is {R}")
    if d.get("remove_sample"):
        mask.zero_()
    return R, logp, mask


def _metadata(d: dict[str, Any], miles_index: int) -> dict[str, Any]:
    """The sample's metadata plus what grpolab has no field for: Miles status and index, a dict
    reward, chat messages."""
    meta = _jsonable(d.get("metadata") or {})
    meta = meta if isinstance(meta, dict) else {"miles_metadata": meta}
    meta.update(miles_status=str(d["status"]), miles_index=miles_index)
    if isinstance(d["reward"], dict):
        meta["miles_reward"] = _jsonable(d["reward"])
    if d.get("prompt") is not None and not isinstance(d["prompt"], str):
        meta["messages"] = _jsonable(d["prompt"])
    return meta


def miles_samples(
    dump: dict[str, Any], *, name: str = "<dump>", reward_key: str | None = None
) -> list[Sample]:
    """Convert the per-sample dicts of a Miles dump to grpolab `Sample`s.

    prompt_ids = tokens[:len(tokens) - response_length], response_ids = the rest; loss_mask None
    means all ones and `remove_sample: True` zeroes it (as Miles does); status completed -> "stop",
    truncated/aborted/failed -> "length" (original status kept in metadata["miles_status"]);
    `index` becomes the position in the list (the Miles index is kept in metadata["miles_index"]);
    sample_index counts answers within each group in order of appearance.

    Raises:
        RecordingError: a sample that is not a dict, misses a required field, or whose lengths or
            types are inconsistent; the message names the file, sample position and field.
    """
    samples: list[Sample] = []
    seen: dict[int, int] = {}
    for i, d in enumerate(dump["samples"]):
        where = f"{name}: sample {i}"
        if not isinstance(d, dict):
            raise RecordingError(f"{where}: expected a dict, got {type(d).__name__}")
        missing = [k for k in REQUIRED if k not in d or d[k] is None]
        if missing:
            raise RecordingError(
                f"{where}: missing field {missing[0]!r}"
                + (f" (also {missing[1:]})" if len(missing) > 1 else "")
            )
        tokens = _int_list(d["tokens"], f"{where}: tokens")
        R, logp, mask = _response(d, len(tokens), where)
        group = _scalar_int(d["group_index"], f"{where}: group_index")
        meta = _metadata(d, _scalar_int(d["index"], f"{where}: index"))
        P = len(tokens) - R
        samples.append(
            Sample(
                index=i,
                prompt_index=group,
                group_index=group,
                sample_index=seen.get(group, 0),
                seed=0,
                prompt_ids=tokens[:P],
                response_ids=tokens[P:],
                rollout_log_probs=logp,
                loss_mask=mask,
                finish_reason=_finish(d["status"], f"{where}: status"),
                prompt_text=_text(d.get("prompt")),
                response_text=_text(d.get("response")),
                label=_text(d.get("label")),
                reward=_reward(d["reward"], f"{where}: reward", reward_key),
                weight_version=_weight_version(d.get("weight_versions")),
                metadata=meta,
            )
        )
        seen[group] = seen.get(group, 0) + 1
    return samples


def check_output(in_path: str | Path, out_path: str | Path, *, force: bool) -> None:
    """Refuse an output `grpolab replay convert` must not write, with or without `--force`.

    Raises:
        IsADirectoryError: `out_path` is a directory (the message suggests a file inside it).
        ValueError: `out_path` is the input file itself (same path, a symlink or a hard link to it):
            writing it would destroy the dump being converted.
        FileExistsError: `out_path` exists and `force` is False.
    """
    out = Path(out_path)
    if out.is_dir():
        suggestion = out / Path(in_path).with_suffix(".grz").name
        raise IsADirectoryError(
            f"output {out_path} is a directory; give the .grz file to write, e.g. {suggestion}"
        )
    if out.exists() and Path(in_path).exists() and os.path.samefile(in_path, out):
        raise ValueError(
            f"output {out_path} is the input file {in_path}; writing it would destroy the dump being "
            "converted (even with --force): give another output path"
        )
    if not force and out.exists():
        raise FileExistsError(f"{out_path} already exists; pass --force to replace it")


def convert_miles(
    in_path: str | Path,
    out_path: str | Path,
    *,
    reward_key: str | None = None,
    force: bool = False,
    level: int = 3,
) -> int:
    """Convert a Miles/slime `.pt` rollout dump to a `.grz` recording.

    Args:
        in_path: the `.pt` file (read with `torch.load(weights_only=True)` only).
        out_path: destination `.grz` (written atomically).
        reward_key: key to pick when rewards are dicts (Miles `--reward-key`).
        force: replace an existing `out_path` (`grpolab replay convert --force`).

    Returns:
        Bytes written.

    Raises:
        IsADirectoryError / ValueError / FileExistsError: see `check_output` (before reading the dump).
        RecordingError: see `load_miles_pt` and `miles_samples`.
    """
    check_output(in_path, out_path, force=force)
    dump = load_miles_pt(in_path)
    samples = miles_samples(dump, name=str(in_path), reward_key=reward_key)
    rollout_id = dump.get("rollout_id", 0)
    try:
        check_rollout_id(rollout_id)
    except ValueError as e:
        raise RecordingError(f"{in_path}: {e}") from None
    extra = {
        "source": "miles",
        "source_path": str(in_path),
        "seeds_known": False,
        "advantages": "not recorded by Miles; stored as 0, recompute from rewards",
        "prompt_index": "unknown; copied from group_index",
        "miles_metadata": _jsonable(dump.get("metadata") or {}),
        "reward_key": reward_key,
    }
    return save_rollout(
        out_path,
        samples,
        rollout_id=rollout_id,
        weight_version=max((s.weight_version for s in samples), default=0),
        run_seed=0,
        sampler={},
        fingerprints={},
        train_config={},
        extra=extra,
        level=level,
    )
