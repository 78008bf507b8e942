"""checkers/step_hash.py (what --save-model-hash-every-step writes) and diff/layers.py (what reads it)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from grpolab.checkers.step_hash import (
    parameter_hashes,
    read_step_hashes,
    save_step_hashes,
    step_hash_files,
    step_hash_path,
)
from grpolab.diff.layers import first_differing_parameter, layer_divergence


def _params(scale: float = 1.0) -> list[tuple[str, torch.Tensor]]:
    return [
        ("model.norm.weight", torch.ones(4)),
        ("model.layers.1.mlp.up_proj.weight", torch.full((2, 3), scale)),
        ("model.layers.0.self_attn.q_proj.weight", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        ("model.embed_tokens.weight", torch.zeros(3, 2, dtype=torch.bfloat16)),
    ]


def test_parameter_hashes_cover_name_shape_dtype_bytes_in_layer_order() -> None:
    hashes = parameter_hashes(_params())
    assert list(hashes) == [  # Miles' layer order: layers by number, then the rest by name
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ]
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    expected = hashlib.sha256()
    for part in (b"model.layers.0.self_attn.q_proj.weight", b"(2, 3)", b"torch.float32", t.numpy().tobytes()):
        expected.update(part)
    assert hashes["model.layers.0.self_attn.q_proj.weight"] == expected.hexdigest()
    with pytest.raises(ValueError, match="duplicate parameter name model.norm.weight"):
        parameter_hashes([*_params(), ("model.norm.weight", torch.ones(1))])


def test_save_read_and_first_differing_parameter(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for step in (0, 1, 2):
        save_step_hashes(a, step, _params())
        save_step_hashes(b, step, _params(2.0 if step == 2 else 1.0))
    assert list(step_hash_files(a)) == [0, 1, 2] and step_hash_files(tmp_path / "none") == {}
    assert step_hash_path(a, 2) == a / "checks" / "model_hash_step_2.json"
    ha, hb = read_step_hashes(step_hash_path(a, 2)), read_step_hashes(step_hash_path(b, 2))
    layer, notes = layer_divergence(step_hash_files(a), step_hash_files(b))
    assert notes == [] and layer is not None
    assert (layer.step, layer.name) == (2, "model.layers.1.mlp.up_proj.weight")
    assert (layer.hash_a, layer.hash_b) == (ha[layer.name], hb[layer.name])
    assert first_differing_parameter(ha, {k: v for k, v in ha.items() if k != "model.norm.weight"}) == (
        "model.norm.weight"
    )
    with pytest.raises(ValueError, match="step must be >= 0"):
        save_step_hashes(a, -1, _params())


def test_bad_or_one_sided_hash_files(tmp_path: Path) -> None:
    save_step_hashes(tmp_path / "a", 0, _params())
    bad = tmp_path / "b" / "checks" / "model_hash_step_0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"parameters": [1, 2]}')
    with pytest.raises(ValueError, match=f"{bad}: expected a 'parameters' object"):
        layer_divergence(step_hash_files(tmp_path / "a"), step_hash_files(tmp_path / "b"))
    _, notes = layer_divergence(step_hash_files(tmp_path / "a"), {})
    assert notes == ["per-step model hashes on one side only: run A has them, the other none"]
    _, notes = layer_divergence({0: bad}, {3: bad})
    assert notes == ["per-step model hashes do not overlap: A hashed steps [0], B [3]"]
