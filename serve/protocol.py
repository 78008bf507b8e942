r"""SGLang 0.5.23's `/generate` body and response, parsed and built without touching the engine (pure).

Request (`../shared/reference/notes-sglang-http.md` §1.2): `input_ids` (one list, or a list of lists
for a batch) or `text`, `sampling_params` (one dict for all items or one per item), `rid`,
`return_logprob`, `return_sampling_mask`; `text` and `input_ids` together are a 400 (give one).
An unknown key inside `sampling_params` is the contract's 400 with serde's text (`unknown field
\`foo\`, expected one of ...`). An unknown top-level key is a 400 too, naming it: SGLang ignores
it, so a misspelt `retrun_logprob` would silently give an answer without log-probs. Every field of
`sglang.api.v1.GenerateRequest` (`GENERATE_KEYS`) and the Python-only fields SGLang's server reads
(`PYTHON_ONLY_KEYS`) are known. Known keys this engine cannot honour (penalties,
grammars, `n > 1`, streaming) are refused with a 400 that names them rather than
ignored, so a client never gets silently different sampling.

SGLang's sampling rules kept here: `temperature < 1e-6` means greedy (temperature 1, top-k 1);
`top_k` -1 or >= 2**30 means no limit, 0 is refused; the model's EOS ids stop generation unless
`ignore_eos`; `max_new_tokens` defaults to 128, and 0 generates nothing (with `return_logprob` and
`logprob_start_len` k >= 0: the prompt's log-probs from position k, Miles' prefill re-scoring).
`sampling_seed` is always honoured (a real SGLang only with `--enable-deterministic-inference`); a
request without one gets 42 on a deterministic server (SGLang's default seed) and a fresh random seed
otherwise.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from grpolab.core.engine.base import SamplingParams
from grpolab.serve.field_types import GENERATE_TYPES, SAMPLING_TYPES, serde_type, type_error
from grpolab.serve.stops import stop_strings

SAMPLING_KEYS: tuple[str, ...] = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
    "watermark", "choice",
)  # fmt: skip
"""`sglang.api.v1.SamplingParams`' fields, in the contract's order (its 400 text lists them so)."""

GENERATE_KEYS: tuple[str, ...] = (
    "rid", "text", "input_ids", "stream", "sampling_params", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "token_ids_logprob", "return_hidden_states", "return_text_in_logprobs",
    "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size",
    "routed_dp_rank", "disagg_prefill_dp_rank", "image_data", "mm_hashes", "video_data", "audio_data",
    "extra_key", "priority", "cache_salt", "require_reasoning", "lora_path", "session_params", "kv_hints",
    "routing_key", "max_thinking_tokens", "session_id", "custom_logit_processor", "custom_labels",
    "images_config", "return_prompt_token_ids", "routed_experts_start_len", "return_sampling_mask",
    "modalities",
)  # fmt: skip
"""`sglang.api.v1.GenerateRequest`'s fields, in the contract's order (tests/serve checks the list)."""
PYTHON_ONLY_KEYS: tuple[str, ...] = (
    "input_embeds", "mm_content_hashes", "use_audio_in_video", "video_config", "watermark",
    "sampling_logprobs_mode", "return_flat_raw_top_logprobs", "return_flat_raw_output_top_logprobs",
    "return_flat_raw_top_logprobs_b64", "log_metrics", "return_routed_experts", "return_indexer_topk",
    "lora_id", "positional_embed_overrides", "data_parallel_rank", "conversation_id", "http_worker_ipc",
    "background", "no_logs", "return_bytes", "return_entropy", "external_trace_header", "received_time",
    "need_wait_for_mm_inputs", "num_items_assigned", "encoder_urls", "max_dynamic_patch",
    "min_dynamic_patch", "image_max_dynamic_patch", "video_max_dynamic_patch", "mm_processor_kwargs",
    "multi_item_delimiter_indices", "token_indices_to_pool",
    "model",
)  # fmt: skip
"""Top-level keys SGLang 0.5.23's stack sends that the generated contract does not list: the other
fields of its Python `GenerateReqInput` (`srt/managers/io_struct.py`, in its order), and `model`,
which sglang-router 0.3.2 adds to every /generate it forwards (with `log_metrics`, `background`,
`no_logs`, `return_bytes`). Accepted; those that ask for output this server does not produce are
refused by value (`_UNSUPPORTED_TOP`)."""

_NEUTRAL = {
    "stop_regex": (None, "", []), "min_p": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0), "min_new_tokens": (None, 0), "n": (None, 1),
    "json_schema": (None,), "regex": (None,), "ebnf": (None,), "structural_tag": (None,),
    "logit_bias": (None, {}), "custom_params": (None,), "beam_width": (None, 1), "watermark": (None,),
    "choice": (None, []),
}  # fmt: skip
"""Known sampling keys this engine cannot honour, and the values that mean "off" (accepted)."""

_UNSUPPORTED_TOP = {"stream": (None, False), "token_ids_logprob": (None,), "return_hidden_states": (None, False),
                    "input_embeds": (None,), "image_data": (None,), "video_data": (None,),
                    "audio_data": (None,), "lora_path": (None,), "return_routed_experts": (None, False),
                    "return_indexer_topk": (None, False), "return_entropy": (None, False),
                    "sampling_logprobs_mode": (None,)}  # fmt: skip
"""Top-level keys whose non-default value asks for something this server does not produce."""

TOP_K_ALL = 1 << 30
"""SGLang's "no top-k limit" (`sampling_params.py`: TOP_K_ALL = 1 << 30; -1 means the same)."""
_GREEDY_EPS = 1e-6  # SGLang's _SAMPLING_EPS: a smaller temperature means greedy
DEFAULT_SEED = 42
"""SGLang's seed for a request without `sampling_seed` under deterministic inference."""


class RequestError(ValueError):
    """A request the server refuses with HTTP 400. `body` is the JSON answer.

    `contract=True` gives SGLang's contract-gate shape `{"error": "<text>"}`; otherwise its
    handler shape `{"error": {"message": "<text>"}}`.
    """

    def __init__(self, message: str, *, contract: bool = False) -> None:
        super().__init__(message)
        self.body: dict = {"error": message} if contract else {"error": {"message": message}}


@dataclass(frozen=True, kw_only=True)
class GenerateItem:
    """One sample of a `/generate` call, ready for the engine.

    Attributes:
        rid: the request id echoed in `meta_info.id`.
        prompt_ids: prompt token ids (non-empty).
        params: the engine's sampling settings (stop ids include the model's EOS unless ignore_eos).
        seed: the sample's sampling seed (int64 range).
        return_logprob / return_sampling_mask: what the response carries (`params.top_logprobs_num`
            > 0 adds `output_top_logprobs`).
        logprob_start_len: with `return_logprob`, the first prompt position of `input_token_logprobs`
            (-1: none, SGLang's default).
        prefill_only: `max_new_tokens` 0 (Miles' prefill re-scoring): nothing is generated; `params`
            then holds 1 and is not used to decode.
        skip_special_tokens: whether `text` drops special tokens (SGLang default True).
        stop: stop strings (`serve/stops.py` cuts the answer after the first one).
        no_stop_trim: the text keeps the matched stop string.
    """

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    return_logprob: bool = False
    return_sampling_mask: bool = False
    logprob_start_len: int = -1
    prefill_only: bool = False
    skip_special_tokens: bool = True
    stop: tuple[str, ...] = ()
    no_stop_trim: bool = False


@dataclass(frozen=True, kw_only=True)
class ParsedSampling:
    """One request's `sampling_params`, parsed: what `GenerateItem` takes from them."""

    params: SamplingParams
    seed: int
    skip_special_tokens: bool
    stop: tuple[str, ...]
    no_stop_trim: bool
    prefill_only: bool = False


def is_one_of(value: object, allowed: tuple) -> bool:
    """`value` equals one of `allowed` with the same JSON type (so `true` is not 1, nor 0.0 False)."""
    return any(value == a and type(value) is type(a) for a in allowed)


def _check_types(fields: dict, types: dict) -> None:
    """A contract 400 (serde's text) for the first bool/int/float field of the wrong JSON type."""
    if (error := type_error(fields, types)) is not None:
        raise RequestError(error, contract=True)


def _number(sp: dict, key: str, default: float) -> float | int:
    """`sp[key]` (typed by `_check_types` already), null meaning the default."""
    v = sp.get(key)
    return default if v is None else v


def _int_list(v: object, what: str) -> list[int]:
    """A JSON list of ints (token ids), else a 400 naming `what` and, in a list, the first bad element and its
    index, in the contract gate's words ("input_ids[0]: invalid type: floating point `1.5`, expected i64")."""
    if not isinstance(v, list):
        raise RequestError(f"{what} must be a list of integer token ids, got {serde_type(v)}", contract=True)
    for i, t in enumerate(v):
        if not isinstance(t, int) or isinstance(t, bool):
            raise RequestError(
                f"{what}[{i}]: invalid type: {serde_type(t)}, expected i64 (an integer token id)",
                contract=True,
            )
    return v


def parse_sampling(
    sp: object, *, eos_ids: tuple[int, ...], deterministic: bool, top_logprobs_num: int = 0
) -> ParsedSampling:
    """One `sampling_params` dict -> the engine's SamplingParams, seed, stop strings, text rules.

    Args:
        top_logprobs_num: the request's top-level `top_logprobs_num` (0-20), put in the params.

    Raises:
        RequestError: not a dict, an unknown key (serde's text), a wrong type, a value out of
            SGLang's range, or a known key this engine cannot honour at a non-neutral value.
    """
    sp = {} if sp is None else sp
    if not isinstance(sp, dict):
        raise RequestError(f"invalid type: {serde_type(sp)}, expected struct SamplingParams", contract=True)
    for key in sp:
        if key not in SAMPLING_KEYS:
            listed = ", ".join(f"`{f}`" for f in SAMPLING_KEYS)
            raise RequestError(f"unknown field `{key}`, expected one of {listed}", contract=True)
    _check_types(sp, SAMPLING_TYPES)
    for key, neutral in _NEUTRAL.items():
        if key in sp and not is_one_of(sp[key], neutral):
            raise RequestError(f"grpolab serve does not support sampling_params.{key} = {sp[key]!r}")
    temperature = float(_number(sp, "temperature", 1.0))
    top_p = float(_number(sp, "top_p", 1.0))
    top_k = int(_number(sp, "top_k", TOP_K_ALL))
    max_new = int(_number(sp, "max_new_tokens", 128))
    if not 0 <= temperature < float("inf"):
        raise RequestError(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0 < top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {top_p}.")
    if top_k == 0 or top_k < -1:
        raise RequestError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if max_new < 0:
        raise RequestError(f"max_new_tokens must be >= 0, got {max_new}.")
    if temperature < _GREEDY_EPS:  # SGLang: greedy is temperature 1 over the top-1 set
        temperature, top_k = 1.0, 1
    stops = set(_int_list(sp.get("stop_token_ids") or [], "sampling_params.stop_token_ids"))
    if sp.get("ignore_eos") is not True:
        stops.update(eos_ids)
    seed = sp.get("sampling_seed")
    if seed is None:
        seed = DEFAULT_SEED if deterministic else secrets.randbits(63)
    elif not -(2**63) <= seed < 2**63:
        raise RequestError(f"sampling_seed must be an integer in [-2**63, 2**63 - 1], got {seed!r}")
    try:
        stop = stop_strings(sp.get("stop"), "sampling_params.stop")
    except ValueError as e:
        raise RequestError(str(e)) from e
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=0 if top_k == -1 or top_k >= TOP_K_ALL else top_k,
        max_new_tokens=max(max_new, 1),
        stop_token_ids=tuple(sorted(stops)),
        top_logprobs_num=top_logprobs_num,
    )
    return ParsedSampling(
        params=params,
        seed=seed,
        skip_special_tokens=sp.get("skip_special_tokens") is not False,
        stop=stop,
        no_stop_trim=sp.get("no_stop_trim") is True,
        prefill_only=max_new == 0,
    )


MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (OpenAI's `top_logprobs` bound)."""


def top_logprobs_count(value: object, what: str) -> int:
    """A request's top-alternatives count (null: 0) as an int in [0, MAX_TOP_LOGPROBS].

    Raises:
        RequestError: not an integer, or out of range; the message names `what`.
    """
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise RequestError(f"{what} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}")
    return value


def _per_item(value: object, n: int, what: str) -> list:
    """A per-request field broadcast to n items: a list must have n entries, a scalar is repeated."""
    if isinstance(value, list):
        if len(value) != n:
            raise RequestError(f"{what} has {len(value)} entries for a batch of {n} prompts")
        return value
    return [value] * n


def _prompts(body: dict, tokenize) -> tuple[list[list[int]], bool]:
    """The body's prompts as token-id lists, and whether it is a batch."""
    ids = body.get("input_ids")
    if ids is not None and body.get("text") is not None:
        raise RequestError(
            "give one of text and input_ids, not both (SGLang: Either text, input_ids or input_embeds "
            "should be provided.)"
        )
    if ids is None and body.get("text") is not None:
        text = body["text"]
        texts = text if isinstance(text, list) else [text]
        if not all(isinstance(t, str) for t in texts):
            raise RequestError("text must be a string or a list of strings", contract=True)
        return [tokenize(t) for t in texts], isinstance(text, list)
    if ids is None:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    batch = isinstance(ids, list) and len(ids) > 0 and isinstance(ids[0], list)
    prompts = [
        _int_list(p, f"input_ids[{k}]" if batch else "input_ids")
        for k, p in enumerate(ids if batch else [ids])
    ]
    for i, p in enumerate(prompts):
        if not p:
            raise RequestError(
                f"input_ids{f'[{i}]' if batch else ''} is empty; a prompt needs at least one token"
            )
    return prompts, batch


def parse_generate(
    body: object, *, eos_ids: tuple[int, ...], deterministic: bool, tokenize=None
) -> tuple[list[GenerateItem], bool]:
    """A `/generate` JSON body -> (one `GenerateItem` per prompt, whether the caller sent a batch).

    Args:
        body: the parsed JSON body.
        eos_ids: the model's stop ids (added unless `ignore_eos`).
        deterministic: the server runs with `--enable-deterministic-inference` (seedless default 42).
        tokenize: str -> list[int], for `text` prompts.

    Raises:
        RequestError: anything SGLang would refuse, or this server cannot produce.
    """
    if not isinstance(body, dict):
        raise RequestError(
            f"invalid type: {serde_type(body)}, expected struct GenerateRequest", contract=True
        )
    unknown = [k for k in body if k not in GENERATE_KEYS and k not in PYTHON_ONLY_KEYS]
    if unknown:
        listed = ", ".join(f"`{k}`" for k in unknown)
        raise RequestError(
            f"unknown top-level key(s) {listed} in /generate; grpolab serve refuses keys it does not know "
            f"rather than ignore them; expected some of {', '.join(GENERATE_KEYS + PYTHON_ONLY_KEYS)}"
        )
    _check_types(body, GENERATE_TYPES)
    for key, defaults in _UNSUPPORTED_TOP.items():
        if key in body and not is_one_of(body[key], defaults):
            raise RequestError(f"grpolab serve does not support {key} = {body[key]!r} in /generate")
    prompts, batch = _prompts(body, tokenize)
    n = len(prompts)
    rid = body.get("rid")
    if rid is None:
        rids = [secrets.token_hex(16) for _ in range(n)]
    elif isinstance(rid, str):
        rids = [rid] if not batch else [f"{rid}_{i}" for i in range(n)]
    else:
        rids = [str(r) for r in _per_item(rid, n, "rid")]
    sps = _per_item(body.get("sampling_params"), n, "sampling_params")
    logprob = _per_item(body.get("return_logprob"), n, "return_logprob")
    mask = _per_item(body.get("return_sampling_mask"), n, "return_sampling_mask")
    top_n = _per_item(body.get("top_logprobs_num"), n, "top_logprobs_num")
    starts = _per_item(body.get("logprob_start_len"), n, "logprob_start_len")
    items = []
    for i in range(n):
        k = top_logprobs_count(top_n[i], "top_logprobs_num")
        sampling = parse_sampling(sps[i], eos_ids=eos_ids, deterministic=deterministic, top_logprobs_num=k)
        start = _logprob_start(starts[i], len(prompts[i]), f"logprob_start_len{f'[{i}]' if batch else ''}")
        items.append(
            GenerateItem(
                rid=rids[i], prompt_ids=prompts[i], params=sampling.params, seed=sampling.seed,
                return_logprob=logprob[i] is True or k > 0, return_sampling_mask=mask[i] is True,
                logprob_start_len=start, prefill_only=sampling.prefill_only,
                skip_special_tokens=sampling.skip_special_tokens, stop=sampling.stop,
                no_stop_trim=sampling.no_stop_trim,
            )
        )  # fmt: skip
    return items, batch


def _logprob_start(value: object, prompt_len: int, what: str) -> int:
    """`logprob_start_len` (null: -1, output tokens only) as a prompt position in [-1, prompt_len).

    Raises:
        RequestError: below -1, or not a position of the prompt (SGLang clamps it; refused here, as the
            answer would not hold the positions asked for).
    """
    if value is None or value == -1:
        return -1
    if not 0 <= value < prompt_len:
        raise RequestError(
            f"{what} must be -1 (output tokens only) or a prompt position in [0, {prompt_len}), got {value}"
        )
    return value
