"""serve/field_types.py's tables are SGLang's: every bool/int/float field of the installed contract's
`GenerateRequest` and `SamplingParams`, with its kind and shape, and the same 400 text for a wrong type."""

from __future__ import annotations

import types
import typing

import msgspec
import pytest

from grpolab.serve.field_types import GENERATE_TYPES, SAMPLING_TYPES, type_error

_KIND = {bool: "bool", int: "i64", float: "f64"}


def _union(t: object) -> tuple:
    return typing.get_args(t) if typing.get_origin(t) in (typing.Union, types.UnionType) else (t,)


def _scalar_fields(struct: type) -> dict[str, tuple[str, str]]:
    """The contract struct's fields typed bool/int/float (alone, optional, or with a list of them)."""
    found = {}
    for field in msgspec.structs.fields(struct):
        args = _union(field.type)
        scalars = [a for a in args if a in _KIND]
        if not scalars:
            continue
        assert len(scalars) == 1, field
        lists = [typing.get_args(a)[0] for a in args if typing.get_origin(a) is list]
        if not lists:
            shape = "optional" if type(None) in args else "scalar"
        else:
            inner = _union(lists[0])
            assert [a for a in inner if a is not type(None)] == scalars, field
            shape = "optional_or_list" if type(None) in inner else "or_list"
        found[field.name] = (_KIND[scalars[0]], shape)
    return found


def test_the_tables_list_every_scalar_field_of_the_contract_with_its_type(contract) -> None:
    assert GENERATE_TYPES == _scalar_fields(contract.GenerateRequest)
    assert SAMPLING_TYPES == _scalar_fields(contract.SamplingParams)


@pytest.mark.parametrize(
    "body",
    [
        {"return_logprob": "yes"},  # was accepted: bool("yes") is True
        {"return_logprob": ["yes"]},
        {"return_sampling_mask": 1},
        {"return_prompt_token_ids": None},
        {"bootstrap_port": "x"},
        {"priority": 1.5},
        {"sampling_params": {"ignore_eos": "yes"}},
        {"sampling_params": {"skip_special_tokens": 0}},
        {"sampling_params": {"top_k": 1.0}},
        {"sampling_params": {"temperature": True}},
        {"sampling_params": {"sampling_seed": "7"}},
        {"sampling_params": {"no_stop_trim": "no"}},
    ],
)
def test_a_wrong_type_gets_the_contracts_text(contract, body: dict) -> None:
    body = {"input_ids": [1], **body}
    with pytest.raises(contract.JsonContractError) as info:
        contract.GenerateRequest.from_json_value(body)
    sp = body.get("sampling_params") or {}
    ours = type_error(body, GENERATE_TYPES) or type_error(sp, SAMPLING_TYPES)
    assert ours == str(info.value)


@pytest.mark.parametrize(
    "body",
    [
        {"return_logprob": [True, False], "bootstrap_port": [None, 3], "priority": None},
        {"sampling_params": {"temperature": 1, "top_p": 0.5, "ignore_eos": False, "sampling_seed": -5}},
    ],
)
def test_well_typed_fields_pass_as_in_the_contract(contract, body: dict) -> None:
    body = {"input_ids": [1], **body}
    contract.GenerateRequest.from_json_value(body)
    assert type_error(body, GENERATE_TYPES) is None
    assert type_error(body.get("sampling_params") or {}, SAMPLING_TYPES) is None
