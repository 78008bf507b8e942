"""Checkpoints: `--save DIR` writes `DIR/iter_<N>/`, `--load DIR` resumes from the newest one.

An iteration directory holds the policy weights (safetensors), optimizer and scheduler state and
RNG state (`torch.save`, read back with `weights_only=True`), and `trainer_state.json` (next
rollout id, data position, weight version, model fingerprint, the data's identity). It is written
under a temporary name (`.iter_<N>.<pid>@<host>.<random>`) and renamed into place, then
`latest_checkpointed_iteration.txt` is replaced atomically, so a crash mid-save never leaves a half
checkpoint that `--load` would pick. The temporary folder a killed save leaves behind is removed by
the next save or load of the same directory (`remove_stale_temps`), which logs what it removed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
import secrets
import shutil
import socket
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from grpolab.core.actor import Actor
from grpolab.core.atomic import atomic_write_bytes
from grpolab.core.data_identity import DataIdentity, identity_differences, unrecorded_fields
from grpolab.core.dist import barrier
from grpolab.core.model_files import compare_model_fingerprints, config_only_warning
from grpolab.core.processes import is_this_host, pid_alive
from grpolab.core.safe_load import UnreadableFileError, UnsafeFileError, load_pt
from grpolab.core.save_dir import LATEST_FILE

log = logging.getLogger("grpolab")
TEMP_NAME = re.compile(r"^\.iter_\d+\.(?:(?P<pid>\d+)@(?P<host>.+)\.[0-9a-f]{8}|[A-Za-z0-9_]+)$")
"""A save's temporary folder: `.iter_<N>.<pid>@<host>.<8 hex>`, or `.iter_<N>.<random>` as
`tempfile.mkdtemp` named them before the owner was recorded."""
FOREIGN_TEMP_STALE_S = 3600.0
"""A temporary folder written from another host counts as abandoned when nothing in it changed for
this long (seconds); its pid cannot be checked from here. An hour: far longer than a save, which
writes its files without pause."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be used with this run (names the directory and the reason)."""


@dataclass(frozen=True, kw_only=True)
class TrainerState:
    """Counters restored on resume."""

    next_rollout_id: int
    data_position: int
    weight_version: int
    model_fingerprint: str
    data_identity: dict[str, Any] | None = None
    """`DataIdentity.to_dict()` of the run that saved it; None in checkpoints from before it was stored."""
    lr_schedule: dict[str, Any] | None = None
    """`LRSchedule.as_dict()` of the run that saved it (None before schedules were stamped)."""
    next_lr: float | None = None
    """The lr the next optimizer step trains at under that schedule (the stamp a resume is checked against)."""
    hf_checkpoint: str | None = None
    """The run's `--hf-checkpoint` (as given), the origin `grpolab convert --to-hf` exports onto."""


def save_due(rollout_id: int, *, num_rollout: int, save_interval: int | None, exit_after: int | None) -> bool:
    """Whether `--save` writes a checkpoint after rollout `rollout_id`: after the last rollout (of
    `--num-rollout`, or `--debug-exit-after-rollout`) and after every `--save-interval` rollouts (Miles)."""
    if rollout_id in (num_rollout - 1, exit_after):
        return True
    return save_interval is not None and (rollout_id + 1) % save_interval == 0


def iteration_dir(parent: str | Path, next_rollout_id: int) -> Path:
    """`parent/iter_0000007` for a checkpoint taken before rollout 7 runs."""
    return Path(parent) / f"iter_{next_rollout_id:07d}"


def save_checkpoint(parent: str | Path, actor: Actor, state: TrainerState) -> Path:
    """Write one checkpoint atomically; return its directory.

    Multi-rank: every rank calls it (gathering weights and optimizer state are collectives); rank 0
    writes full tensors, so a checkpoint loads at any world size with the same optimizer layout.
    Folders and files get the usual permissions (0777/0666 less the umask). Temporary folders that
    earlier, killed saves left in `parent` are removed first (`remove_stale_temps`).
    """
    parent = Path(parent)
    final = iteration_dir(parent, state.next_rollout_id)
    weights = {name: t.detach().cpu().contiguous() for name, t in actor.named_weights()}
    optimizer_state = actor.optimizer_state()
    if not actor.dist.is_primary:
        barrier(actor.dist)  # rank 0 writes; return once the directory is in place
        return final
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(parent)
    tmp = parent / f".{final.name}.{os.getpid()}@{socket.gethostname()}.{secrets.token_hex(4)}"
    tmp.mkdir()  # mode 0777 less the umask, like every other folder (tempfile.mkdtemp makes 0700)
    try:
        save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
        if optimizer_state is not None and actor.scheduler is not None:
            torch.save(optimizer_state, tmp / "optimizer.pt")
            torch.save(actor.scheduler.state_dict(), tmp / "scheduler.pt")
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(state.__dict__, indent=2) + "\n")
        _usual_file_permissions(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_bytes(parent / LATEST_FILE, f"{state.next_rollout_id}\n".encode())
    barrier(actor.dist)
    return final


def _usual_file_permissions(folder: Path) -> None:
    """Give the files in `folder` mode 0666 less the umask (safetensors writes 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~mask)


def remove_stale_temps(parent: str | Path) -> list[tuple[str, int]]:
    """Remove the temporary folders of saves that never finished from `parent`; log each one.

    A folder is stale when its owner is known to be gone: its pid is not alive on this host (or is
    this process, which saves one checkpoint at a time), it was written from another host and
    unchanged for `FOREIGN_TEMP_STALE_S`, or its name records no owner (grpolab before the owner
    was recorded). A folder still being written by a live save is kept and said so.

    Returns:
        (name, bytes) of each folder removed.
    """
    removed = []
    for path in sorted(Path(parent).glob(".iter_*")):
        match = TEMP_NAME.match(path.name)
        if match is None or not path.is_dir():
            continue
        owner = _live_owner(path, match)
        if owner is not None:
            log.info(f"checkpoint: kept {path.name} in {parent}: a save is still writing it ({owner})")
            continue
        size = directory_bytes(path)
        shutil.rmtree(path, ignore_errors=True)
        log.info(
            f"checkpoint: removed {path.name} ({size / 1e6:.1f} MB) from {parent}, left by a save that did not finish"
        )
        removed.append((path.name, size))
    return removed


def _live_owner(path: Path, match: re.Match[str]) -> str | None:
    """Who is still writing a temporary folder (a phrase), or None when its save is over."""
    if match["pid"] is None:
        return None
    pid, host = int(match["pid"]), match["host"]
    if not is_this_host(host):
        age = time.time() - max([path.stat().st_mtime] + [p.stat().st_mtime for p in path.rglob("*")])
        return f"host {host}, changed {age:.0f} s ago" if age < FOREIGN_TEMP_STALE_S else None
    if pid == os.getpid() or not pid_alive(pid):
        return None
    return f"pid {pid} on this host is alive"


def directory_bytes(path: str | Path) -> int:
    """Total size in bytes of the files under `path` (0 for a missing folder)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def find_latest(parent: str | Path, flag: str = "--load") -> Path | None:
    """The newest complete iteration directory under `parent` (or `parent` itself if it is one), or None.

    None means an empty directory: the run starts fresh. `flag` is the flag errors name (`--load`,
    `grpolab convert --to-hf`).

    Raises:
        CheckpointError: the latest-file names a directory that does not exist, or iteration
            directories exist without a latest-file.
    """
    parent = Path(parent)
    if (parent / "trainer_state.json").exists():
        return parent  # an iteration directory itself
    latest = parent / LATEST_FILE
    if not latest.exists():
        iters = sorted(p.name for p in parent.glob("iter_*") if p.is_dir())
        if iters:
            raise CheckpointError(
                f"{flag}: {parent} has {', '.join(iters[-3:])} but no {LATEST_FILE}; pass one iteration directory to {flag}"
            )
        return None
    text = latest.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{flag}: {latest} should hold an iteration number, found {text[:40]!r}")
    path = iteration_dir(parent, int(text))
    if not (path / "trainer_state.json").exists():
        raise CheckpointError(f"{flag}: {latest} names {path.name}, but {path} is missing or incomplete")
    return path


def load_checkpoint(
    path: str | Path,
    actor: Actor,
    *,
    model_fingerprint: str,
    data: DataIdentity,
    allow_data_change: bool = False,
) -> TrainerState:
    """Restore weights, optimizer, scheduler and RNG into `actor`; return the counters.

    `data` is this run's prompt stream; a checkpoint saved with another one is refused unless
    `allow_data_change` (`--allow-data-change`), which logs a warning instead (`check_data`).

    Raises:
        CheckpointError: the checkpoint was made from another model (fingerprint or tensor
            names/shapes differ) or, without `allow_data_change`, with other data (names each
            differing field), or one of its files is missing or unreadable (names the file).
    """
    path = Path(path)
    try:
        return _load_checkpoint(
            path, actor, model_fingerprint=model_fingerprint, data=data, allow_data_change=allow_data_change
        )
    except CheckpointError:
        raise
    except Exception as e:  # truncated safetensors, empty .pt, edited json: say which checkpoint
        raise CheckpointError(f"--load: {path} is unreadable ({type(e).__name__}: {e})") from e


def _load_checkpoint(
    path: Path, actor: Actor, *, model_fingerprint: str, data: DataIdentity, allow_data_change: bool
) -> TrainerState:
    state = read_trainer_state(path)
    match = compare_model_fingerprints(state.model_fingerprint, model_fingerprint)
    if match == "config-only":
        log.warning(config_only_warning(f"--load: {path}"))
    if match == "different":
        raise CheckpointError(
            f"--load: {path} was saved from another model (model fingerprint {state.model_fingerprint} != "
            f"{model_fingerprint} of --hf-checkpoint)"
        )
    check_data(path, state, data, allow_change=allow_data_change)
    weights = load_file(path / "model.safetensors")
    own = dict(actor.named_weights())
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    wrong = [
        f"{k}: {tuple(weights[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in weights and weights[k].shape != v.shape
    ]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"--load: {path} does not fit --hf-checkpoint: missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatches {wrong[:5]}"
        )
    optimizer_state = None
    if actor.optimizer is not None and (path / "optimizer.pt").exists():
        optimizer_state = _load_state(path / "optimizer.pt", actor.device)
    scheduler_state = _load_state(path / "scheduler.pt") if optimizer_state is not None else None
    rng = _load_state(path / "rng.pt")
    actor.load_state(weights, optimizer_state)
    if scheduler_state is not None:
        assert actor.scheduler is not None
        actor.scheduler.load_state_dict(scheduler_state)
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_random_state(rng["python"]))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state


def _load_state(path: Path, map_location: Any = None) -> Any:
    """A checkpoint's `.pt` state as plain data (`core.safe_load.load_pt`, weights_only=True).

    Raises:
        CheckpointError: `--load` and the file's reason (refused on purpose when it holds pickled
            classes; unreadable when missing or truncated).
    """
    try:
        return load_pt(path, map_location=map_location)
    except (UnsafeFileError, UnreadableFileError) as e:
        raise CheckpointError(f"--load: {e}") from None


def read_trainer_state(path: Path, flag: str = "--load") -> TrainerState:
    """The counters in `path/trainer_state.json`; `flag` is the flag errors name (`--load`, `--to-hf`).

    Raises:
        CheckpointError: the file is unreadable, not JSON, not an object, or lacks or adds fields
            (the message names the file and what is wrong).
    """
    file = path / "trainer_state.json"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise CheckpointError(f"{flag}: {file} is unreadable ({e.strerror or e})") from None
    except ValueError as e:
        raise CheckpointError(f"{flag}: {file} is not valid JSON ({e}); edited or half-written?") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{flag}: {file} should hold a JSON object, found {type(raw).__name__}")
    fields = set(TrainerState.__dataclass_fields__)
    required = {n for n, f in TrainerState.__dataclass_fields__.items() if f.default is dataclasses.MISSING}
    missing, unknown = sorted(required - set(raw)), sorted(set(raw) - fields)
    if missing or unknown:
        what = [f"missing {', '.join(missing)}"] if missing else []
        what += [f"unknown fields {', '.join(unknown)}"] if unknown else []
        raise CheckpointError(f"{flag}: {file} does not hold a checkpoint's counters ({'; '.join(what)})")
    for name, kinds in _field_kinds().items():
        value = raw.get(name)
        if name in raw and not (value is None and type(None) in kinds) and not _is_kind(value, kinds):
            want = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise CheckpointError(f"{flag}: {file}: {name} should be {want}, found {json.dumps(value)[:60]}")
    return TrainerState(**raw)


def _is_kind(value: object, kinds: tuple[type, ...]) -> bool:
    """`value` is one of `kinds` as JSON gives them: a bool is no int, an int is a float too."""
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds) or (float in kinds and isinstance(value, int))


def _field_kinds() -> dict[str, tuple[type, ...]]:
    """Each TrainerState field's accepted JSON types, from its annotation (`int`, `str | None`, ...)."""
    import typing

    out = {}
    for name, hint in typing.get_type_hints(TrainerState).items():
        args = (
            typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        )
        out[name] = tuple(typing.get_origin(a) or a for a in args)
    return out


def check_data(path: Path, state: TrainerState, data: DataIdentity, *, allow_change: bool) -> None:
    """Compare the data identity stored in a checkpoint with this run's.

    A checkpoint without one (saved before it was stored) loads with a warning; a matching one
    whose file moved loads with a note.

    Raises:
        CheckpointError: the prompt order differs (names each field, the saved and the new value)
            and `allow_change` is False; with it, a warning is logged instead.
    """
    saved = state.data_identity
    if not isinstance(saved, dict):
        log.warning(
            f"warning: --load: {path} records no data identity (saved by an older grpolab), so whether "
            "--prompt-data, --rollout-batch-size, --seed and --rollout-shuffle match the run that saved it "
            "cannot be checked"
        )
        return
    unrecorded = unrecorded_fields(saved)
    if unrecorded:
        log.warning(
            f"warning: --load: {path} does not record {', '.join(unrecorded)} (saved by an older grpolab), "
            "so whether this run renders the prompts as the run that saved it cannot be checked"
        )
    differences = identity_differences(saved, data)
    if not differences:
        if saved.get("prompt_data") != data.prompt_data:
            log.info(
                f"--load: --prompt-data {data.prompt_data} has the content of {saved.get('prompt_data')}"
            )
        return
    what = "; ".join(differences)
    if not allow_change:
        raise CheckpointError(
            f"--load: {path} was saved with other data ({what}); resuming would skip, repeat or render "
            f"differently the prompts from rollout {state.next_rollout_id} on. Use the run's own data and flags, or pass "
            "--allow-data-change to resume anyway"
        )
    log.warning(
        f"warning: --load: {path} was saved with other data ({what}); --allow-data-change: resuming "
        f"anyway, so rollouts from {state.next_rollout_id} on read other prompts than the saved run would have"
    )


def _as_random_state(state: object) -> tuple:
    """`random.setstate` needs tuples; the safe loader may hand back lists."""
    version, internal, gauss = state  # type: ignore[misc]
    return (version, tuple(internal), gauss)
