"""Per-layer model hashes: closed-form SHA-256, save/check files, diffing real checkpoints, the CLI."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.hash_command import add_hash_parser, run_hash_command
from grpolab.checkers.model_hash import (
    HashInputError,
    check_model_hash,
    diff_checkpoints,
    layer_bucket,
    layer_hashes,
    save_model_hash,
)


@pytest.mark.parametrize(
    ("name", "bucket"),
    [
        ("model.layers.3.mlp.up_proj.weight", "layer_0003"),
        ("model.layers.12.self_attn.q_proj.weight", "layer_0012"),
        ("decoder.layers.7.weight", "layer_0007"),
        ("layers.0.w", "layer_0000"),
        ("encoder.layer.5.w", "layer_0005"),
        ("model.embed_tokens.weight", "non_layer"),
        ("model.norm.weight", "non_layer"),
        ("lm_head.weight", "non_layer"),
        ("model.mylayers.3.w", "non_layer"),
    ],
)
def test_layer_bucket(name: str, bucket: str) -> None:
    assert layer_bucket(name) == bucket


def _manual_digest(items: list[tuple[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for name, t in sorted(items, key=lambda p: p[0]):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(
            t.contiguous().numpy().tobytes()
            if t.dtype != torch.bfloat16
            else t.view(torch.int16).numpy().tobytes()
        )
    return h.hexdigest()


def _params() -> list[tuple[str, torch.Tensor]]:
    return [
        ("model.layers.1.mlp.w", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        ("model.layers.0.b", torch.tensor([1.5, -2.0], dtype=torch.bfloat16)),
        ("model.embed_tokens.weight", torch.tensor([[0.25, 0.5]], dtype=torch.float32)),
        ("model.layers.0.a", torch.tensor([3, 4], dtype=torch.int64)),
        ("model.layers.10.x", torch.ones(2, 2).t()),  # non-contiguous
    ]


def test_layer_hashes_closed_form_and_order() -> None:
    params = _params()
    hashes = layer_hashes(params)
    assert list(hashes) == ["layer_0000", "layer_0001", "layer_0010", "non_layer"]
    assert hashes["layer_0000"] == _manual_digest([params[3], params[1]])
    assert hashes["layer_0001"] == _manual_digest([params[0]])
    assert hashes["layer_0010"] == _manual_digest([("model.layers.10.x", torch.ones(2, 2))])
    assert hashes["non_layer"] == _manual_digest([params[2]])
    assert layer_hashes(reversed(params)) == hashes


def test_layer_hashes_change_only_the_touched_layer() -> None:
    base = layer_hashes(_params())
    changed = _params()
    changed[0] = ("model.layers.1.mlp.w", changed[0][1].clone().index_fill_(1, torch.tensor([2]), 9.0))
    after = layer_hashes(changed)
    assert [k for k in base if base[k] != after[k]] == ["layer_0001"]
    # dtype, shape and name are hashed too, not only the bytes
    as64 = [(n, t.double()) if n == "model.layers.1.mlp.w" else (n, t) for n, t in _params()]
    assert layer_hashes(as64)["layer_0001"] != base["layer_0001"]
    reshaped = [(n, t.reshape(3, 2)) if n == "model.layers.1.mlp.w" else (n, t) for n, t in _params()]
    assert layer_hashes(reshaped)["layer_0001"] != base["layer_0001"]
    renamed = [("model.layers.1.mlp.v" if n == "model.layers.1.mlp.w" else n, t) for n, t in _params()]
    assert layer_hashes(renamed)["layer_0001"] != base["layer_0001"]


def test_layer_hashes_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        layer_hashes([("a", torch.zeros(1)), ("a", torch.ones(1))])


def test_save_and_check_model_hash(tmp_path: Path) -> None:
    hashes = layer_hashes(_params())
    iter_dir = tmp_path / "iter_0000003"
    path = save_model_hash(iter_dir, hashes, rank=1)
    assert path == iter_dir / "model_hash_rank1.json"
    text = path.read_text()
    assert json.loads(text) == hashes
    assert text.startswith('{\n  "layer_0000": ')  # indent 2, sorted keys: Miles' JSON shape
    check_model_hash(iter_dir, hashes, rank=1)

    bad = dict(hashes)
    bad["layer_0001"] = "0" * 64
    del bad["non_layer"]
    bad["layer_0099"] = "f" * 64
    with pytest.raises(CheckFailure) as e:
        check_model_hash(iter_dir, bad, rank=1)
    msg = str(e.value)
    assert e.value.checker == "model_hash"
    assert "mismatched layers (1): layer_0001" in msg
    assert "missing layers (in the file, not in the model) (1): non_layer" in msg
    assert "extra layers (in the model, not in the file) (1): layer_0099" in msg


def test_check_model_hash_missing_or_bad_file(tmp_path: Path) -> None:
    iter_dir = tmp_path / "iter_0000002"
    with pytest.raises(CheckFailure, match=r"hash file missing: .*iter_0000002/model_hash_rank0\.json"):
        check_model_hash(iter_dir, {"non_layer": "x"}, rank=0)
    iter_dir.mkdir()
    (iter_dir / "model_hash_rank0.json").write_text("{not json")
    with pytest.raises(CheckFailure, match="unreadable"):
        check_model_hash(iter_dir, {"non_layer": "x"}, rank=0)
    with pytest.raises(ValueError, match="--ci-save-model-hash: .* not a checkpoint iteration directory"):
        save_model_hash(tmp_path / "checkpoints", {}, rank=0)


@pytest.fixture()
def tiny_weights(tiny_model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(tiny_model_dir / "model.safetensors")


def _write(path: Path, weights: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file(weights, path / "model.safetensors")
    return path


def test_diff_identical_real_model(tmp_path: Path, tiny_model_dir: Path, tiny_weights: dict) -> None:
    ckpt = _write(tmp_path / "iter_0000001", tiny_weights)
    diff = diff_checkpoints(tiny_model_dir, ckpt)
    assert diff.identical and diff.first_differing_layer is None and diff.tensors == []
    assert list(diff.hashes_a) == ["layer_0000", "layer_0001", "layer_0002", "layer_0003", "non_layer"]
    # the streamed hashes are the in-memory ones, so they compare with model_hash_rank0.json
    assert diff.hashes_a == layer_hashes(tiny_weights.items())


def test_diff_names_first_layer_and_tensors(tmp_path: Path, tiny_weights: dict) -> None:
    a = _write(tmp_path / "a" / "iter_0000001", tiny_weights)
    changed = {k: v.clone() for k, v in tiny_weights.items()}
    original = changed["model.layers.2.mlp.up_proj.weight"][0, 0].item()
    changed["model.layers.2.mlp.up_proj.weight"][0, 0] = 1.0
    changed["model.layers.3.self_attn.k_norm.weight"] = changed["model.layers.3.self_attn.k_norm.weight"][:16]
    del changed["model.norm.weight"]
    changed["model.embed_tokens.weight"] = changed["model.embed_tokens.weight"].to(torch.bfloat16)
    b = _write(tmp_path / "b" / "iter_0000001", changed)

    diff = diff_checkpoints(a, b)
    assert not diff.identical
    assert diff.first_differing_layer == "layer_0002"
    assert diff.differing_layers == ["layer_0002", "layer_0003", "non_layer"]
    by_name = {d.name: d for d in diff.tensors}
    assert list(by_name) == [
        "model.layers.2.mlp.up_proj.weight",
        "model.layers.3.self_attn.k_norm.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ]
    up = by_name["model.layers.2.mlp.up_proj.weight"]
    assert (up.what, up.shape_a, up.max_abs_diff) == ("values", (384, 128), abs(1.0 - original))
    assert by_name["model.layers.3.self_attn.k_norm.weight"].what == "shape"
    assert by_name["model.layers.3.self_attn.k_norm.weight"].shape_b == (16,)
    assert by_name["model.norm.weight"].what == "missing in B"
    emb = by_name["model.embed_tokens.weight"]
    assert emb.what == "dtype" and emb.dtype_b == "torch.bfloat16" and 0 < emb.max_abs_diff < 0.01


def test_diff_sharded_hf_dir_equals_single_file(
    tmp_path: Path, tiny_model_dir: Path, tiny_weights: dict
) -> None:
    names = sorted(tiny_weights)
    shards = {"model-00001-of-00002.safetensors": names[:20], "model-00002-of-00002.safetensors": names[20:]}
    hf = tmp_path / "hf"
    hf.mkdir()
    for file, keys in shards.items():
        save_file({k: tiny_weights[k] for k in keys}, hf / file)
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert diff_checkpoints(hf, tiny_model_dir / "model.safetensors").identical


def test_diff_bad_inputs_name_the_path(tmp_path: Path, tiny_weights: dict) -> None:
    with pytest.raises(HashInputError, match=f"{tmp_path / 'nope'}: no such file"):
        diff_checkpoints(tmp_path / "nope", tmp_path / "nope")
    root = tmp_path / "ckpts"
    _write(root / "iter_0000004", tiny_weights)
    with pytest.raises(HashInputError, match="holds checkpoints; pass one of them, e.g. .*iter_0000004"):
        diff_checkpoints(root, root / "iter_0000004")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 3)
    with pytest.raises(HashInputError, match="junk.safetensors: not a readable safetensors file"):
        diff_checkpoints(junk, root / "iter_0000004")


def _cli(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="grpolab")
    add_hash_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    assert args.command == "hash"
    out, err = io.StringIO(), io.StringIO()
    return run_hash_command(args, out=out, err=err), out.getvalue(), err.getvalue()


def test_hash_diff_cli_exit_codes(tmp_path: Path, tiny_model_dir: Path, tiny_weights: dict) -> None:
    a = _write(tmp_path / "a" / "iter_0000001", tiny_weights)
    changed = dict(tiny_weights)
    changed["model.layers.1.mlp.down_proj.weight"] = tiny_weights["model.layers.1.mlp.down_proj.weight"] * 2
    b = _write(tmp_path / "b" / "iter_0000001", changed)

    code, out, _ = _cli("hash", "diff", str(tiny_model_dir), str(a))
    assert code == 0 and "identical: 5 layers, 46 tensors" in out

    code, out, _ = _cli("hash", "diff", str(a), str(b))
    assert code == 1
    assert "1 of 5 layers differ; first differing layer: layer_0001" in out
    row = next(line for line in out.splitlines() if "down_proj" in line)
    expected = tiny_weights["model.layers.1.mlp.down_proj.weight"].double().abs().max().item()
    assert row.split()[:5] == ["layer_0001", "model.layers.1.mlp.down_proj.weight", "values", "(128,", "384)"]
    assert row.endswith(f"{expected:.3e}")

    code, out, _ = _cli("hash", "diff", str(a), str(b), "--json")
    data = json.loads(out)
    assert code == 1 and data["first_differing_layer"] == "layer_0001"
    assert data["tensors"][0]["max_abs_diff"] == pytest.approx(expected, rel=1e-6)

    code, out, err = _cli("hash", "diff", str(a), str(tmp_path / "missing"))
    assert code == 2 and out == ""
    assert err.startswith("grpolab hash diff: error: ") and str(tmp_path / "missing") in err
    config = tiny_model_dir / "config.json"
    code, _, err = _cli("hash", "diff", str(config), str(a))
    assert code == 2 and f"{config}: expected a .safetensors file" in err


def test_dtensor_hashes_its_local_shard(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        plain = torch.arange(12, dtype=torch.float32).reshape(4, 3)
        sharded = distribute_tensor(plain, mesh, [Shard(0)])
        assert layer_hashes([("model.layers.0.w", sharded)]) == layer_hashes([("model.layers.0.w", plain)])
    finally:
        dist.destroy_process_group()
