"""The control routes an RL trainer calls between rollouts: cache, pause, abort, memory, weights.

Each handler takes the server state and the request and answers as SGLang 0.5.23 does
(`srt/entrypoints/http_server.py`; fields in `../shared/reference/notes-sglang-http.md` §1.4):

- `/flush_cache`: text body; 400 while requests run or wait.
- `/pause_generation` `{mode}` (default "abort") / `/continue_generation`: `{"message", "status": "ok"}`.
- `/abort_request` `{rid, abort_all}`: 200 with an empty body.
- `/release_memory_occupation` / `/resume_memory_occupation` `{tags}`: 200 with JSON `null`; release
  needs an idle server; resuming a tag that is not released (or releasing one twice) is a 400.
- `/update_weights_from_disk` `{model_path, weight_version, flush_cache, abort_all_requests}`: loads
  every `*.safetensors` file of the directory (or the one file) into the engine, then flushes the
  cache unless `flush_cache` is false; `{success, message, num_paused_requests}`.

A boolean field (`abort_all`, `flush_cache`, `abort_all_requests`) must be JSON `true` or `false`
(`serve.http.bool_field`): `"no"` is a 400, never read as truthy.
- `/update_weight_version` `{new_version, abort_all_requests}`: `{success, message, new_version}`.
- `/weights_checker` `{action}`: snapshot / reset_tensors / compare / checksum;
  `{success, message[, ranks, per_engine_checksum]}`, 400 when a compare finds differences.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from grpolab.core.engine.base import ChecksWeights, capability
from grpolab.core.engine.weight_bucket import tensor_checksum
from grpolab.serve.http import bool_field, error_response, read_object
from grpolab.serve.state import MEMORY_TAGS, ServerState

CHECKSUM_SKIP = ("cos_sin_cache", "cos_cache", "sin_cache", "inv_freq", "freqs_cis", "expert_mask_gpu")
"""Tensor-name substrings SGLang's weight checker always skips (`srt/utils/weight_checker.py`)."""
CHECKER_ACTIONS = ("snapshot", "reset_tensors", "compare", "checksum")
"""`/weights_checker`'s actions (SGLang's three plus checksum)."""
MAX_LISTED = 10
"""How many differing tensors a failed compare names in its message."""


async def flush_cache(state: ServerState, request: Request) -> Response:
    """Drop cached KV state; refused (400) while requests run or wait, as in SGLang."""
    busy = state.batcher.running + state.batcher.waiting
    if busy:
        return Response(
            f"Flush cache failed: {state.batcher.running} running and "
            f"{state.batcher.waiting} waiting requests.\n",
            status_code=400,
        )
    await state.batcher.exclusive(state.engine.flush_cache)
    return Response(
        "Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation will not be performed.)\n"
    )


async def pause_generation(state: ServerState, request: Request) -> Response:
    """Stop starting batches (`mode` abort|retract|in_place, default abort); returns when none runs."""
    body = await read_object(request)
    try:
        await state.batcher.pause(body.get("mode") or "abort")
    except ValueError as e:
        return error_response(str(e))
    return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(state: ServerState, request: Request) -> Response:
    """Start batches again after `/pause_generation`."""
    await read_object(request)
    state.batcher.resume()
    return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})


async def abort_request(state: ServerState, request: Request) -> Response:
    """Abort queued requests by `rid` (a batch's rid prefix aborts its items) or all (`abort_all`)."""
    body = await read_object(request)
    rid = body.get("rid") or ""
    if not isinstance(rid, str):
        return error_response(f"abort_request: rid must be a string, got {rid!r}")
    try:
        abort_all = bool_field(body, "abort_all", False, route="abort_request")
    except ValueError as e:
        return error_response(str(e))
    state.batcher.abort(rid, abort_all=abort_all)
    return Response(status_code=200)


def _tags(body: dict) -> list[str]:
    """The body's memory tags (all three when null or empty). Raises ValueError on an unknown tag."""
    tags = body.get("tags") or list(MEMORY_TAGS)
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"tags must be a list of strings, got {tags!r}")
    unknown = [t for t in tags if t not in MEMORY_TAGS]
    if unknown:
        raise ValueError(f"unknown memory tag(s) {unknown}; expected some of {list(MEMORY_TAGS)}")
    return tags


async def release_memory(state: ServerState, request: Request) -> Response:
    """Release memory tags; needs an idle server. Releasing "weights" releases the engine's memory."""
    try:
        tags = _tags(await read_object(request))
        busy = state.batcher.running + state.batcher.waiting
        if busy:
            raise ValueError(
                f"release_memory_occupation needs an idle server; {state.batcher.running} running and "
                f"{state.batcher.waiting} waiting requests (pause or wait for them first)"
            )
        twice = [t for t in tags if t in state.released]
        if twice:
            raise ValueError(f"memory tag(s) {twice} are already released")
    except ValueError as e:
        return error_response(str(e))
    if "weights" in tags:
        await state.batcher.exclusive(state.engine.release_memory)
    elif "kv_cache" in tags:
        await state.batcher.exclusive(state.engine.flush_cache)
    state.released.update(tags)
    state.batcher.blocked_reason = state.blocked_reason()
    return JSONResponse(None)


async def resume_memory(state: ServerState, request: Request) -> Response:
    """Resume released tags; a tag that is not released is an error (SGLang raises too)."""
    try:
        tags = _tags(await read_object(request))
        missing = [t for t in tags if t not in state.released]
        if missing:
            raise ValueError(
                f"memory tag(s) {missing} are not released; released now: {sorted(state.released)}"
            )
    except ValueError as e:
        return error_response(str(e))
    if "weights" in tags:
        await state.batcher.exclusive(state.engine.resume_memory)
    state.released.difference_update(tags)
    state.batcher.blocked_reason = state.blocked_reason()
    return JSONResponse(None)


def safetensors_files(model_path: str) -> list[Path]:
    """The `*.safetensors` files named by `model_path` (a directory, or one file), sorted.

    Raises:
        ValueError: the path does not exist or holds no safetensors file (no other format is read:
            pickled `.bin`/`.pt` checkpoints are refused).
    """
    path = Path(model_path)
    if path.is_file() and path.suffix == ".safetensors":
        return [path]
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        what = "does not exist" if not path.exists() else "holds no *.safetensors file"
        raise ValueError(f"update_weights_from_disk: {model_path} {what} (only safetensors are loaded)")
    return files


def check_dtypes(named: list[tuple[str, torch.Tensor]], engine_tensors: dict[str, torch.Tensor]) -> None:
    """Refuse a tensor whose dtype is of another kind than the engine's tensor of that name (an int64 or
    bool tensor into a float32 weight, a float into an integer buffer): `copy_` would cast it silently.
    Another float precision is cast, as the in-process engine does (the trainer's float32 weights into a
    `--dtype bfloat16` engine); names the engine lacks are left to its own KeyError.

    Raises:
        ValueError: naming the first such tensor and both dtypes.
    """
    for name, tensor in named:
        target = engine_tensors.get(name)
        if target is not None and _dtype_kind(tensor.dtype) != _dtype_kind(target.dtype):
            raise ValueError(
                f"dtype mismatch for {name!r}: the file holds {str(tensor.dtype).removeprefix('torch.')}, "
                f"the engine's tensor is {str(target.dtype).removeprefix('torch.')}"
            )


def _dtype_kind(dtype: torch.dtype) -> str:
    return "complex" if dtype.is_complex else "float" if dtype.is_floating_point else "bool/int"


def _load_weights(state: ServerState, model_path: str, version: int) -> int:
    """Engine thread: read the files and copy every tensor into the engine; return the tensor count."""
    named: list[tuple[str, torch.Tensor]] = []
    for f in safetensors_files(model_path):
        try:
            named.extend(load_file(str(f), device="cpu").items())
        except SafetensorError as e:  # its text ("header too large") does not say which file
            raise ValueError(f"{f}: not a readable safetensors file: {e}") from e
    model = state.engine.model
    check_dtypes(
        named, {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    )
    state.engine.update_weights(named, weight_version=version)
    return len(named)


async def update_weights_from_disk(state: ServerState, request: Request) -> Response:
    """Load a safetensors bucket (HF names) into the engine and set `weight_version` when given."""
    body = await read_object(request)
    model_path, version = body.get("model_path"), body.get("weight_version")
    if not isinstance(model_path, str) or not model_path:
        return _fail("update_weights_from_disk needs model_path (a directory of .safetensors files)")
    if version is not None and not isinstance(version, str):
        return _fail(f"weight_version must be a string, got {version!r}")
    try:  # SGLang's UpdateWeightFromDiskReqInput: flush_cache true, abort_all_requests false by default
        flush = bool_field(body, "flush_cache", True, route="update_weights_from_disk")
        abort_all = bool_field(body, "abort_all_requests", False, route="update_weights_from_disk")
    except ValueError as e:
        return _fail(str(e))
    if abort_all:
        state.batcher.abort(abort_all=True, message="Aborted by update_weights_from_disk.")
    target = (
        state.engine_version(version) if version is not None else getattr(state.engine, "weight_version", 0)
    )
    try:
        n = await state.batcher.exclusive(_load_weights, state, model_path, target)
    except (ValueError, KeyError, OSError, SafetensorError) as e:  # SafetensorError: a corrupt file
        return _fail(f"Failed to update weights: {e}")
    if flush:
        await state.batcher.exclusive(state.engine.flush_cache)
    message = f"Succeeded to update model weights ({n} tensors from {model_path})."
    if version is not None:
        state.weight_version = version
        message += f" Weight version updated to {version}."
    return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})


def _fail(message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message, "num_paused_requests": 0}, status_code=400)


async def update_weight_version(state: ServerState, request: Request) -> Response:
    """Set the weight version string (aborting queued requests unless `abort_all_requests` is false)."""
    body = await read_object(request)
    version = body.get("new_version")
    if not isinstance(version, str):
        return JSONResponse(
            {
                "success": False,
                "message": f"Failed to update weight version: new_version must be a string, got {version!r}",
            },
            status_code=400,
        )
    try:
        abort_all = bool_field(body, "abort_all_requests", True, route="update_weight_version")
    except ValueError as e:
        return JSONResponse(
            {"success": False, "message": f"Failed to update weight version: {e}"}, status_code=400
        )
    if abort_all:
        state.batcher.abort(abort_all=True, message="Aborted by update_weight_version.")
    state.weight_version = version
    return JSONResponse(
        {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
    )


def checksums(state: ServerState) -> dict[str, str]:
    """Engine thread: 16-hex sha256 of each persistent tensor's bytes, by name (SGLang's skips applied)."""
    out = {}
    for name, tensor in state.engine.model.state_dict().items():
        if any(s in name for s in CHECKSUM_SKIP):
            continue
        out[name] = tensor_checksum(tensor)
    return out


async def weights_checker(state: ServerState, request: Request) -> Response:
    """SGLang's weight checker: snapshot, reset_tensors, compare (400 on differences), checksum."""
    body = await read_object(request)
    action = body.get("action") or "checksum"
    if action == "checksum":
        sums = await state.batcher.exclusive(checksums, state)
        overall = hashlib.sha256("".join(f"{n}:{h}\n" for n, h in sorted(sums.items())).encode()).hexdigest()
        rank = {
            "checksums": sums,
            "per_gpu_checksum": overall,
            "parallelism_info": {"role": "regular", "rank": 0, "size": 1, "tp_rank": 0, "tp_size": 1,
                                 "dp_rank": 0, "dp_size": 1, "pp_rank": 0, "pp_size": 1},
        }  # fmt: skip
        return JSONResponse(
            {
                "success": True,
                "message": f"checksum of {len(sums)} tensors",
                "ranks": [rank],
                "per_engine_checksum": overall,
            }
        )
    if action not in CHECKER_ACTIONS:
        message = f"unknown weights_checker action {action!r}; expected one of {', '.join(CHECKER_ACTIONS)}"
        return JSONResponse({"success": False, "message": message}, status_code=400)
    checker = capability(state.engine, ChecksWeights)
    if checker is None:
        return JSONResponse(
            {"success": False, "message": "this engine has no weights checker"}, status_code=400
        )
    try:
        mismatches = await state.batcher.exclusive(checker.weights_checker, action)
    except ValueError as e:
        return JSONResponse({"success": False, "message": str(e)}, status_code=400)
    skip = body.get("skip_tensor_list") or []
    mismatches = [m for m in mismatches if not any(s in m.name for s in skip)]
    if mismatches:
        listed = "; ".join(
            f"{m.name} {list(m.shape)} max_abs_err={m.max_abs_err:.3g}" for m in mismatches[:MAX_LISTED]
        )
        more = f" (and {len(mismatches) - MAX_LISTED} more)" if len(mismatches) > MAX_LISTED else ""
        message = f"compare: {len(mismatches)} tensors differ from the snapshot: {listed}{more}"
        return JSONResponse({"success": False, "message": message}, status_code=400)
    return JSONResponse({"success": True, "message": f"{action}: ok"})
