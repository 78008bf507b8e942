"""SGLang 0.5.23's `/generate` answer built from an engine result (pure): `generate_response`,
`abort_response` and the tagged finish reason (`../shared/reference/notes-sglang-http.md` §1.3)."""

from __future__ import annotations

import torch

from grpolab.core.engine.base import GenerationResult, SamplingParams
from grpolab.serve.protocol import GenerateItem


def finish_reason_json(
    result: GenerationResult, params: SamplingParams, matched_stop: str | None = None
) -> dict:
    """SGLang's tagged finish reason: stop with the matched stop string or token id, or length with
    the limit."""
    if matched_stop is not None:
        return {"type": "stop", "matched": matched_stop}
    if result.finish_reason == "stop":
        return {"type": "stop", "matched": result.response_ids[-1]}
    return {"type": "length", "length": params.max_new_tokens}


def generate_response(
    item: GenerateItem,
    result: GenerationResult,
    *,
    weight_version: str,
    text: str,
    vocab_size: int,
    seconds: float,
    matched_stop: str | None = None,
    prompt_log_probs: torch.Tensor | None = None,
) -> dict:
    """One `/generate` answer in SGLang's shape (`GenerateResponse`), meta_info included.

    `matched_stop`: the stop string that ended the answer (`serve/stops.py`), if one did.
    `prompt_log_probs` (float32 [P - k - 1], with `item.logprob_start_len` k >= 0): the prompt's log-probs
    after position k, written as `input_token_logprobs` triples from position k, the first with a null
    log-prob (SGLang's shape: notes-sglang-http.md §1.3). A `prefill_only` item finishes "length" 0.
    `output_top_logprobs` (with `params.top_logprobs_num` k > 0): per token, its k most likely
    alternatives `[logprob, token_id, null]`, descending, under the distribution it was sampled from;
    alternatives outside the kept top-p/top-k support (log-prob -inf) are left out.

    Log-probs are float32 values written as JSON doubles (exact: float32 -> float64 -> repr round-trips).
    `output_token_sampling_mask` lists each token's kept ids ascending (the whole vocabulary when no
    top-p/top-k filtering applied); `output_token_sampling_logprobs` is each token's behaviour log-prob.

    Raises:
        ValueError: log-probs are asked for and some are NaN or infinite (JSON has no such numbers;
            the answer was an HTTP 500 without a word): the message says where to look.
    """
    ids = list(result.response_ids)
    n = len(ids)
    wants_floats = item.return_logprob or item.return_sampling_mask
    if wants_floats and n and not bool(result.log_probs.isfinite().all()):
        bad = int((~result.log_probs.isfinite()).sum())
        raise ValueError(
            f"request {item.rid}: {bad} of its {n} log-probs are NaN or infinite (the engine's weights "
            "may hold non-finite values: /weights_checker checksum, or the last /update_weights_from_disk)"
        )
    meta: dict = {
        "id": item.rid,
        "finish_reason": {"type": "length", "length": 0}
        if item.prefill_only
        else finish_reason_json(result, item.params, matched_stop),
        "prompt_tokens": len(item.prompt_ids),
        "completion_tokens": n,
        "cached_tokens": 0,
        "e2e_latency": seconds,
        "weight_version": weight_version,
        "weight_versions": [{"version": weight_version, "start": 0, "end": n}],
    }
    logps = result.log_probs.tolist()
    if item.return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(logps, ids)]
        meta["output_token_logprobs_length"] = n
    if prompt_log_probs is not None:
        k = item.logprob_start_len
        meta["input_token_logprobs"] = [[None, item.prompt_ids[k], None]] + [
            [lp, tok, None] for lp, tok in zip(prompt_log_probs.tolist(), item.prompt_ids[k + 1 :])
        ]
    if item.params.top_logprobs_num and result.top_log_probs is not None:
        meta["output_top_logprobs"] = top_logprob_rows(result.top_log_probs)
    if item.return_sampling_mask:
        if result.kept_token_ids is not None:
            masks = [k.tolist() for k in result.kept_token_ids]
        else:
            masks = [list(range(vocab_size)) for _ in ids]
        meta["output_token_sampling_mask"] = masks
        meta["output_token_sampling_logprobs"] = logps
        meta["output_token_sampling_mask_length"] = len(masks)
    return {"text": text, "output_ids": ids, "meta_info": meta}


def top_logprob_rows(top: tuple[torch.Tensor, torch.Tensor]) -> list[list[list]]:
    """(float32 [R, k] log-probs, int64 [R, k] ids) -> per token `[[logprob, id, None], ...]`, -inf left out."""
    values, ids = top[0].tolist(), top[1].tolist()
    return [
        [[lp, tok, None] for lp, tok in zip(vs, ts) if lp != float("-inf")] for vs, ts in zip(values, ids)
    ]


def abort_response(item: GenerateItem, message: str, *, weight_version: str) -> dict:
    """The answer for a request aborted before it ran: no tokens, `finish_reason` type abort."""
    meta = {
        "id": item.rid,
        "finish_reason": {"type": "abort", "message": message, "status_code": None, "err_type": None},
        "prompt_tokens": len(item.prompt_ids),
        "completion_tokens": 0,
        "cached_tokens": 0,
        "weight_version": weight_version,
        "weight_versions": [{"version": weight_version, "start": 0, "end": 0}],
    }
    if item.return_logprob:
        meta["output_token_logprobs"] = []
    return {"text": "", "output_ids": [], "meta_info": meta}
