"""SGLang's native /generate and /weights_checker bodies and answers, as pure functions (no I/O).

`generate_body` builds one sample's `GenerateRequest` (SGLang 0.5.23's fields only; the test suite
validates it against `sglang.api.v1.api_types`), `parse_generate_answer` reads one answer into a
`GenerationResult`, `parse_mismatches` reads the tensors a failed `/weights_checker` compare names.
`http_engine.HttpEngine` does the sending.
"""

from __future__ import annotations

import re
import uuid

import torch

from grpolab.core.engine.base import GenerationRequest, GenerationResult, SamplingParams, TensorMismatch

UNNAMED = "<unnamed>"
"""The name of a differing tensor the engine counted but did not name (checkers print a count instead)."""
_MISMATCH = re.compile(r"(\S+) \[([\d, ]*)\] max_abs_err=([-+.\w]+)")  # not the quoted JSON's `"}`


def request_rid(session: str, call: int, index: int) -> str:
    """ "grpolab-<session>-<call>-<index>": unique, and `grpolab serve` decodes a batch's rows sorted by
    the numbers in it (serve/batching.rid_order), which puts them in request order, as in-process."""
    return f"grpolab-{session}-{call}-{index}"


def generate_body(request: GenerationRequest, params: SamplingParams, *, rid: str | None = None) -> dict:
    """The /generate body for one sample (SGLang's `GenerateRequest` fields only); `rid` defaults to
    a random "grpolab-<hex>". No stop ids sends `ignore_eos` (a server adds the model's EOS to the stop
    ids otherwise, so it would stop where the in-process engine does not)."""
    sampling = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "sampling_seed": request.seed,
    }
    if not params.stop_token_ids:  # the in-process engine's "never stop early": the server adds no EOS
        sampling["ignore_eos"] = True
    body = {
        "input_ids": list(request.prompt_ids),
        "sampling_params": sampling,
        "return_logprob": True,
        "rid": rid if rid is not None else f"grpolab-{uuid.uuid4().hex}",
    }
    if params.filters_support:
        body["return_sampling_mask"] = True
    return body


def parse_generate_answer(answer: object, params: SamplingParams, version: int) -> GenerationResult:
    """One /generate answer -> GenerationResult (log-probs float32 [R]; kept ids when filtered).

    Raises:
        RuntimeError: an aborted request or an answer without the fields asked for (naming them).
    """
    if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
        raise RuntimeError(f"/generate answered without meta_info: {str(answer)[:300]}")
    ids, meta = list(answer.get("output_ids") or []), answer["meta_info"]
    finish = (meta.get("finish_reason") or {}).get("type")
    if finish not in ("stop", "length"):
        raise RuntimeError(f"/generate finished with {meta.get('finish_reason')!r} (not stop or length)")
    triples = meta.get("output_token_logprobs")
    if triples is None or [t[1] for t in triples] != ids:
        raise RuntimeError("/generate answered without output_token_logprobs matching output_ids")
    kept = None
    if params.filters_support:
        masks = meta.get("output_token_sampling_mask")
        if masks is None or len(masks) != len(ids):
            raise RuntimeError("/generate answered without output_token_sampling_mask for every token")
        kept = [torch.tensor(sorted(m), dtype=torch.int64) for m in masks]
    raw_version = str(meta.get("weight_version", ""))
    return GenerationResult(
        response_ids=ids,
        log_probs=torch.tensor([t[0] for t in triples], dtype=torch.float32),
        finish_reason=finish,
        kept_token_ids=kept,
        weight_version=int(raw_version) if raw_version.isdigit() else version,
    )


def parse_mismatches(message: str, *, engine: int, quoted: int | None = None) -> list[TensorMismatch]:
    """The tensors a failed `/weights_checker` compare names, plus one `UNNAMED` per other differing tensor.

    The total is the message's "compare: N tensors differ" (else the named ones plus "(and K more)"): an
    error quoted at `quoted` characters (`http_calls.MAX_QUOTED`) loses its tail, so only the entries
    complete before the cut are named. The server reports no mean error: `mean_abs_err` is NaN.
    """
    body = message.split(" answered HTTP 400: ", 1)[-1]
    cut = quoted is not None and len(body) >= quoted
    found = [
        TensorMismatch(
            name=m[1] if engine == 0 else f"engine{engine}/{m[1]}",
            shape=tuple(int(s) for s in m[2].split(",") if s.strip()),
            max_abs_err=float(m[3]),
            mean_abs_err=float("nan"),
        )
        for m in _MISMATCH.finditer(message)
        if not (cut and m.end() == len(message))  # a number the quote may have cut short
    ]
    total = re.search(r"compare: (\d+) tensors differ", message)
    more = re.search(r"\(and (\d+) more\)", message)
    unnamed = int(total[1]) - len(found) if total else int(more[1]) if more else 0
    for _ in range(unnamed):
        found.append(
            TensorMismatch(name=UNNAMED, shape=(), max_abs_err=float("nan"), mean_abs_err=float("nan"))
        )
    return found
