"""The JSON types of SGLang 0.5.23's bool/int/float request fields, checked as its contract checks them (pure).

`grpolab serve` must not depend on sglang, so the types of `GenerateRequest`'s and `SamplingParams`'
scalar fields are listed here, with the contract's 400 texts (serde's: `invalid type: string "yes",
expected a boolean`); tests/serve/test_field_types.py compares these tables with the installed
contract's field types (`sglang.api.v1.api_types`), so a field SGLang adds or retypes fails a test.

A field's shape is how it may appear: "scalar" (the value only, not null), "optional" (or null),
"or_list" (the value, a list of values for a batch, or null: `BoolOrList`), "optional_or_list" (the
same with null list entries: `OptionalInt64OrList`).
"""

from __future__ import annotations

FieldType = tuple[str, str]
"""(kind, shape): kind "bool", "i64" or "f64" (an int is a valid f64, a bool is neither number)."""

GENERATE_TYPES: dict[str, FieldType] = {
    "stream": ("bool", "optional"),
    "return_logprob": ("bool", "or_list"),
    "logprob_start_len": ("i64", "or_list"),
    "top_logprobs_num": ("i64", "or_list"),
    "return_hidden_states": ("bool", "or_list"),
    "return_text_in_logprobs": ("bool", "optional"),
    "bootstrap_port": ("i64", "optional_or_list"),
    "bootstrap_room": ("i64", "optional_or_list"),
    "decode_tp_size": ("i64", "optional_or_list"),
    "routed_dp_rank": ("i64", "optional"),
    "disagg_prefill_dp_rank": ("i64", "optional"),
    "priority": ("i64", "optional"),
    "require_reasoning": ("bool", "optional"),
    "max_thinking_tokens": ("i64", "optional"),
    "return_prompt_token_ids": ("bool", "scalar"),
    "routed_experts_start_len": ("i64", "scalar"),
    "return_sampling_mask": ("bool", "or_list"),
}
"""`sglang.api.v1.GenerateRequest`'s bool/int/float fields."""

SAMPLING_TYPES: dict[str, FieldType] = {
    "max_new_tokens": ("i64", "optional"),
    "temperature": ("f64", "optional"),
    "top_p": ("f64", "optional"),
    "top_k": ("i64", "optional"),
    "min_p": ("f64", "optional"),
    "frequency_penalty": ("f64", "optional"),
    "presence_penalty": ("f64", "optional"),
    "repetition_penalty": ("f64", "optional"),
    "min_new_tokens": ("i64", "optional"),
    "n": ("i64", "optional"),
    "ignore_eos": ("bool", "optional"),
    "skip_special_tokens": ("bool", "optional"),
    "spaces_between_special_tokens": ("bool", "optional"),
    "no_stop_trim": ("bool", "optional"),
    "stream_interval": ("i64", "optional"),
    "sampling_seed": ("i64", "optional"),
    "beam_width": ("i64", "optional"),
}
"""`sglang.api.v1.SamplingParams`' bool/int/float fields."""

_EXPECTED = {"bool": "a boolean", "i64": "i64", "f64": "f64"}
_UNION = {"bool": "Bool", "i64": "Int64", "f64": "Float64"}


def type_error(fields: dict, types: dict[str, FieldType]) -> str | None:
    """The contract's text for the first field of `fields` (a JSON object) whose value has the wrong type
    for `types`, e.g. `invalid type: string "yes", expected a value or an array of values for BoolOrList`;
    None when every listed field is well typed (fields not in `types` are not looked at)."""
    for key, (kind, shape) in types.items():
        if key not in fields:
            continue
        value = fields[key]
        if value is None and shape != "scalar":
            continue
        if shape in ("or_list", "optional_or_list") and isinstance(value, list):
            for item in value:
                if not (item is None and shape == "optional_or_list") and not _fits(item, kind):
                    return f"invalid type: {serde_type(item)}, expected {_EXPECTED[kind]}"
        elif not _fits(value, kind):
            if shape in ("or_list", "optional_or_list"):
                union = ("Optional" if shape == "optional_or_list" else "") + _UNION[kind] + "OrList"
                return (
                    f"invalid type: {serde_type(value)}, expected a value or an array of values for {union}"
                )
            return f"invalid type: {serde_type(value)}, expected {_EXPECTED[kind]}"
    return None


def _fits(value: object, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "i64":
        return isinstance(value, int)  # the range is the caller's (sampling_seed says so itself)
    return isinstance(value, (int, float))


def serde_type(v: object) -> str:
    """serde's name for a JSON value in "invalid type" messages (the contract's `_unexpected`)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map"
