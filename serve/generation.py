"""`/generate` and the health routes: requests go through the batcher, answers in SGLang's shape."""

from __future__ import annotations

import asyncio
import secrets
import time

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from grpolab.core.engine.base import GenerationResult, SamplingParams
from grpolab.serve.http import error_response, read_json
from grpolab.serve.protocol import GenerateItem, RequestError, parse_generate
from grpolab.serve.responses import abort_response, generate_response
from grpolab.serve.state import ServerState
from grpolab.serve.stops import cut_result, find_stop

HEALTH_CHECK_TIMEOUT_S = 20.0
"""How long `/health_generate` waits for its one-token generation (SGLang's HEALTH_CHECK_TIMEOUT)."""


def check_fits(item: GenerateItem, *, vocab_size: int, context_len: int) -> None:
    """Refuse (400) a prompt the model cannot run: a token id outside [0, vocab_size), or a prompt that
    with its `max_new_tokens` does not fit `context_len` tokens (0: the config gave none, no limit).

    The context rules and texts are SGLang's (`TokenizerManager._validate_one_request`): the prompt must
    be shorter than the context length, and prompt + max_new_tokens must be below it too (refused, not
    truncated: SGLang's default without `--allow-auto-truncate`).

    Raises:
        RequestError: the first bad token id (with its position and the vocab size), or the length.
    """
    bad = next(((i, t) for i, t in enumerate(item.prompt_ids) if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(
            f"The input_ids contain token id {bad[1]} (position {bad[0]}), outside the vocabulary: "
            f"token ids must be in [0, {vocab_size}) (vocab size {vocab_size})."
        )
    n, max_new = len(item.prompt_ids), 0 if item.prefill_only else item.params.max_new_tokens
    if context_len and n >= context_len:
        raise RequestError(
            f"The input ({n} tokens) is longer than the model's context length ({context_len} tokens)."
        )
    if context_len and n + max_new >= context_len:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {n + max_new} tokens: {n} tokens from the input messages and "
            f"{max_new} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        )


async def run_items(state: ServerState, items: list[GenerateItem]) -> list[dict]:
    """Generate `items` through the batcher; one SGLang response dict each (aborted ones included),
    cut at an item's first stop string (`serve/stops.py`).

    Raises:
        RequestError: a prompt with a token id outside the vocabulary or too long for the context
            (checked before anything is queued, so a bad request never joins a batch).
        RuntimeError: generation is refused (memory released) or the engine failed.
    """
    for i, item in enumerate(items):
        try:
            check_fits(item, vocab_size=state.vocab_size, context_len=state.context_len)
        except RequestError as e:
            if len(items) == 1:
                raise
            raise RequestError(f"prompt {i} of the batch: {e}") from e  # which one, in a batch
    start = time.perf_counter()
    decoded = iter(await state.batcher.submit([it for it in items if not it.prefill_only]))
    results = [_NOTHING if it.prefill_only else next(decoded) for it in items]
    prompt_lps = [await _prompt_log_probs(state, it) for it in items]
    seconds = time.perf_counter() - start
    out = []
    for item, result, prompt_lp in zip(items, results, prompt_lps):
        if isinstance(result, str):
            out.append(abort_response(item, result, weight_version=state.weight_version))
            continue

        def decode(ids, skip=item.skip_special_tokens) -> str:
            return state.tokenizer.decode(list(ids), skip_special_tokens=skip)

        cut = (
            find_stop(result.response_ids, decode, item.stop, no_stop_trim=item.no_stop_trim)
            if item.stop
            else None
        )
        if cut is not None:
            result, text = cut_result(result, cut.keep), cut.text
        else:
            text = decode(result.response_ids)
        out.append(
            generate_response(
                item, result, weight_version=state.weight_version, text=text,
                vocab_size=state.vocab_size, seconds=seconds, matched_stop=cut.matched if cut else None,
                prompt_log_probs=prompt_lp,
            )
        )  # fmt: skip
    return out


_NOTHING = GenerationResult(response_ids=[], log_probs=torch.zeros(0), finish_reason="length")
"""The result of a `max_new_tokens` 0 request: no tokens."""


async def _prompt_log_probs(state: ServerState, item: GenerateItem) -> torch.Tensor | None:
    """With `return_logprob` and `logprob_start_len` k >= 0: float32 [len(prompt) - k - 1], the prompt's
    log-probs after position k from one prefill of the prompt alone on the engine thread; else None."""
    if not item.return_logprob or item.logprob_start_len < 0:
        return None
    if state.batcher.blocked_reason:
        raise RuntimeError(state.batcher.blocked_reason)
    return await state.batcher.exclusive(
        state.engine.prompt_log_probs, item.prompt_ids, item.logprob_start_len, item.params.temperature
    )


async def generate(state: ServerState, request: Request) -> Response:
    """`/generate`: one response object, or a list for a batch of prompts."""
    try:
        body = await read_json(request, default={})
        items, batch = parse_generate(
            body,
            eos_ids=state.eos_ids,
            deterministic=state.settings.deterministic,
            tokenize=lambda t: state.tokenizer.encode(t, add_special_tokens=False),
        )
        out = await run_items(state, items)
    except RequestError as e:
        return JSONResponse(e.body, status_code=400)
    except (RuntimeError, ValueError) as e:  # memory released, or the engine refused the batch
        return error_response(str(e))
    return JSONResponse(out if batch else out[0])


async def health(state: ServerState, request: Request) -> Response:
    """200 when the engine answers: a busy, paused or released server is alive without generating;
    an idle one must produce one greedy token on `input_ids=[0]` within 20 s, else 503."""
    engine_health = state.engine.health()  # reads flags only: safe beside a running decode
    if not engine_health.ok:
        return Response(f"engine not ok: {engine_health.detail}\n", status_code=503)
    if state.batcher.running or state.batcher.paused or state.released:
        return Response(status_code=200)
    greedy_one = SamplingParams(temperature=1.0, top_k=1, max_new_tokens=1)  # SGLang: temperature 0
    item = GenerateItem(rid=f"HEALTH_CHECK_{secrets.token_hex(8)}", prompt_ids=[0], params=greedy_one, seed=0)
    try:
        await asyncio.wait_for(state.batcher.submit([item]), HEALTH_CHECK_TIMEOUT_S)
    except (asyncio.TimeoutError, RuntimeError) as e:
        return Response(f"health generation failed: {e or 'timed out'}\n", status_code=503)
    return Response(status_code=200)
