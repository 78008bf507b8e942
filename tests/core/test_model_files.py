"""The model folder --hf-checkpoint names: what it must hold (issue 15 items 7, 9) and its fingerprint,
which covers the weights (item 5): a replay or resume with other weights and the same config is refused."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import struct
from pathlib import Path

import pytest
from runs import SHORT

from grpolab.cli import main
from grpolab.core import file_hash
from grpolab.core.model_files import check_model, compare_model_fingerprints
from grpolab.core.modeling import model_fingerprint


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test hashes into its own cache (never the user's ~/.cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "grpolab" / file_hash.CACHE_NAME


def copy_model(tiny_model_dir: Path, where: Path) -> Path:
    shutil.copytree(tiny_model_dir, where)
    return where


def flip_weight_byte(model: Path) -> None:
    """Change one byte of the last tensor's data: same size, same header, other weights."""
    path = model / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))


def test_fingerprint_covers_the_weights_and_keeps_the_config_part(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    other = copy_model(tiny_model_dir, tmp_path / "other")
    flip_weight_byte(other)
    before, after = model_fingerprint(tiny_model_dir), model_fingerprint(other)
    assert before != after  # the same config.json, other weights
    config_part, weights_part = before.split("-w")
    assert len(config_part) == len(weights_part) == 16
    assert after.startswith(config_part + "-w")
    assert compare_model_fingerprints(before, after) == "different"


def test_weight_hashes_are_cached_by_path_size_and_mtime(
    tiny_model_dir: Path, tmp_path: Path, own_cache
) -> None:
    model = copy_model(tiny_model_dir, tmp_path / "m")
    first = model_fingerprint(model)
    weights = str((model / "model.safetensors").resolve())
    cache = json.loads(own_cache.read_text())
    entry = cache[weights]
    assert entry["size"] == (model / "model.safetensors").stat().st_size and len(entry["sha256"]) == 64
    entry["sha256"] = "0" * 64  # a cached hash is used as is: the file is not read again
    own_cache.write_text(json.dumps(cache))
    assert model_fingerprint(model) != first
    st = (model / "model.safetensors").stat()
    os.utime(model / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert model_fingerprint(model) == first  # a new mtime: hashed again, the true hash comes back
    assert not any(p.name.startswith(".file-hashes") for p in own_cache.parent.iterdir())  # no temp left


def test_an_unwritable_cache_does_not_fail(tiny_model_dir: Path, tmp_path: Path, monkeypatch, caplog) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the cache folder cannot be made under a file
    with caplog.at_level(logging.WARNING, logger="grpolab"):
        fingerprint = model_fingerprint(tiny_model_dir)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "ok"))
    assert fingerprint == model_fingerprint(tiny_model_dir)
    assert "cannot write the weight-hash cache" in caplog.text


def test_fingerprints_stored_before_weights_were_covered() -> None:
    current = "0123456789abcdef-wfedcba9876543210"
    assert compare_model_fingerprints(current, current) == "same"
    assert compare_model_fingerprints("0123456789abcdef", current) == "config-only"  # old, same config
    assert compare_model_fingerprints("1123456789abcdef", current) == "different"  # old, other config
    assert compare_model_fingerprints("0123456789abcdef-w0000000000000000", current) == "different"
    assert compare_model_fingerprints("", current) == "different"


def incomplete_models(tiny_model_dir: Path, tmp: Path) -> dict[str, tuple[Path, list[str]]]:
    """Broken copies of the tiny model and what the error must say about each."""
    only_config = tmp / "only_config"
    only_config.mkdir()
    shutil.copy(tiny_model_dir / "config.json", only_config)
    no_weights = copy_model(tiny_model_dir, tmp / "no_weights")
    (no_weights / "model.safetensors").unlink()
    truncated = copy_model(tiny_model_dir, tmp / "truncated")
    size = (truncated / "model.safetensors").stat().st_size
    (truncated / "model.safetensors").write_bytes(
        (tiny_model_dir / "model.safetensors").read_bytes()[:100_000]
    )
    sharded = copy_model(tiny_model_dir, tmp / "sharded")
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    eos_past_vocab = copy_model(tiny_model_dir, tmp / "eos_past_vocab")  # GPT-2's eos in a 1,024-token model
    config = json.loads((eos_past_vocab / "config.json").read_text())
    (eos_past_vocab / "config.json").write_text(
        json.dumps({**config, "eos_token_id": 50256, "pad_token_id": None})
    )
    not_gguf = tmp / "model.gguf"
    not_gguf.write_bytes(b"<html>not a model</html>")
    return {
        "only_config": (
            only_config,
            ["missing the tokenizer (expected tokenizer.json", "missing the weights"],
        ),
        "no_weights": (no_weights, ["missing the weights (expected model.safetensors or pytorch_model.bin"]),
        "truncated": (
            truncated,
            [f"{truncated / 'model.safetensors'} is truncated: header says {size} bytes, file has 100000"],
        ),
        "sharded": (sharded, ["model-00002-of-00002.safetensors is missing (the weight index names it)"]),
        "not_gguf": (not_gguf, [f"{not_gguf} is not a GGUF file: it starts with b'<htm'"]),
        "eos_past_vocab": (
            eos_past_vocab,
            [
                "config.json: the trainer pads with eos_token_id 50256, outside the vocabulary (vocab_size 1024: "
                "ids 0..1023); set pad_token_id in config.json to a token id below vocab_size"
            ],
        ),
    }


def test_incomplete_model_folders_are_bad_input_before_any_run_dir(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    for name, (model, needles) in incomplete_models(tiny_model_dir, tmp_path).items():
        run_dir = tmp_path / f"run_{name}"
        with pytest.raises(SystemExit) as info:
            main(["train", "--hf-checkpoint", str(model), "--run-dir", str(run_dir)])
        err = capsys.readouterr().err
        assert info.value.code == 2, name
        assert f"--hf-checkpoint: {model}" in err and "Traceback" not in err, err
        for needle in needles:
            assert needle in err, (name, err)
        assert not run_dir.exists(), name


def test_only_config_is_reported_as_missing_tokenizer_and_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    only_config = tmp_path / "m"
    only_config.mkdir()
    shutil.copy(tiny_model_dir / "config.json", only_config)
    with pytest.raises(ValueError) as info:
        check_model(only_config)
    message = str(info.value)
    assert "chat template" not in message
    assert "tokenizer.json" in message and "model.safetensors" in message
    check_model(only_config, tokenizer=False, weights=False)  # config alone is what a config read needs


def test_replay_with_other_weights_is_refused_and_old_recordings_warn(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """End to end: record, then replay into the same config with other weights (refused, exit 2), and
    replay a recording whose header carries a fingerprint from before weights were covered (warned)."""
    template = str(tmp_path / "rec" / "r_{rollout_id}.grz")
    base = ["train", *SHORT, "--num-rollout", "1"]
    assert (
        main(
            [
                *base,
                "--debug-rollout-only",
                "--save-debug-rollout-data",
                template,
                "--run-dir",
                str(tmp_path / "a"),
            ]
        )
        == 0
    )
    other = copy_model(tiny_model_dir, tmp_path / "other")
    flip_weight_byte(other)
    replay = [*base, "--load-debug-rollout-data", template, "--hf-checkpoint"]
    capsys.readouterr()
    assert main([*replay, str(other), "--run-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "was recorded with a different setup" in err and "model_fingerprint: recording has" in err
    # the same recording with its fingerprint cut to the config part, as grpolab wrote it before
    from grpolab.replay.recording import load_rollout, save_rollout

    path = Path(template.format(rollout_id=0))
    recording = load_rollout(path)
    fingerprints = {
        **recording.fingerprints,
        "model_fingerprint": recording.fingerprints["model_fingerprint"][:16],
    }
    path.unlink()
    save_rollout(
        path,
        recording.samples,
        rollout_id=0,
        weight_version=recording.weight_version,
        run_seed=recording.run_seed,
        sampler=recording.sampler,
        fingerprints=fingerprints,
        train_config=recording.train_config,
        run_id=recording.run_id,
        run_dir=recording.run_dir,
        extra=recording.extra,
    )
    assert main([*replay, str(tiny_model_dir), "--run-dir", str(tmp_path / "c")]) == 0
    console = (tmp_path / "c" / "console.log").read_text()
    assert "predates weight fingerprints: only the model's config matched" in console


@pytest.mark.slow  # three runs: 33 s on 2 busy cores
def test_resume_with_other_weights_is_refused_and_old_checkpoints_warn(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """--load of a checkpoint saved from other weights (same config) is refused; one whose
    trainer_state.json holds the config-only fingerprint of before resumes with a warning."""
    ck = tmp_path / "ck"
    base = ["train", *SHORT]
    assert main([*base, "--num-rollout", "1", "--save", str(ck), "--run-dir", str(tmp_path / "a")]) == 0
    other = copy_model(tiny_model_dir, tmp_path / "other")
    flip_weight_byte(other)
    capsys.readouterr()
    resume = [*base, "--num-rollout", "2", "--load", str(ck), "--save", str(ck)]
    assert main([*resume, "--hf-checkpoint", str(other), "--run-dir", str(tmp_path / "b")]) == 2
    assert "was saved from another model (model fingerprint" in capsys.readouterr().err
    state_file = ck / "iter_0000001" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["model_fingerprint"] = state["model_fingerprint"].split("-w")[
        0
    ]  # as written before weights counted
    state_file.write_text(json.dumps(state))
    assert main([*resume, "--run-dir", str(tmp_path / "c")]) == 0
    console = (tmp_path / "c" / "console.log").read_text()
    assert f"--load: {ck / 'iter_0000001'} predates weight fingerprints" in console


def corrupt_models(tiny_model_dir: Path, tmp: Path) -> dict[str, tuple[Path, Path, str]]:
    """name -> (--hf-checkpoint value, the file the message names, what it says): the tester's corrupt
    files (F2), each of which gave a traceback or a misleading message before."""
    bad_config = copy_model(tiny_model_dir, tmp / "bad_config")
    (bad_config / "config.json").write_text('{"model_type": \n')
    bad_tok = copy_model(tiny_model_dir, tmp / "bad_tok")
    (bad_tok / "tokenizer.json").write_text("")
    list_config = copy_model(tiny_model_dir, tmp / "list_config")
    (list_config / "config.json").write_text("[1, 2]")
    noise = copy_model(tiny_model_dir, tmp / "noise")
    (noise / "model.safetensors").write_bytes(random.Random(0).randbytes(4096))  # header length ~1e19
    short_gguf = tmp / "fake.gguf"
    short_gguf.write_bytes(b"GGUFxxxx")
    v9_gguf = tmp / "v9.gguf"
    v9_gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 1, 1) + b"\0" * 64)
    huge_gguf = tmp / "huge.gguf"
    huge_gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 10**9, 1) + b"\0" * 64)
    return {
        "bad_config": (bad_config, bad_config / "config.json", "is not valid JSON (line 2 column 1"),
        "bad_tok": (bad_tok, bad_tok / "tokenizer.json", "is not valid JSON (line 1 column 1"),
        "list_config": (list_config, list_config / "config.json", "is a JSON list, expected a JSON object"),
        "noise": (noise, noise / "model.safetensors", "is not a safetensors file"),
        "short_gguf": (short_gguf, short_gguf, "is truncated: 8 bytes, shorter than the 24-byte GGUF header"),
        "v9_gguf": (v9_gguf, v9_gguf, "is not a readable GGUF file: version 9, expected one of (2, 3)"),
        "huge_gguf": (huge_gguf, huge_gguf, "is truncated or corrupt: its header says 1000000000 tensors"),
    }


def test_corrupt_model_files_are_bad_input_naming_the_file(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    for name, (model, file, needle) in corrupt_models(tiny_model_dir, tmp_path).items():
        run_dir = tmp_path / f"run_{name}"
        with pytest.raises(SystemExit) as info:
            main(["train", "--hf-checkpoint", str(model), "--run-dir", str(run_dir)])
        err = capsys.readouterr().err
        assert info.value.code == 2, name
        assert f"--hf-checkpoint: {file} {needle}" in err and "Traceback" not in err, (name, err)
        assert "truncated" not in err or name.endswith("gguf"), err  # random bytes are not "truncated"
        assert not run_dir.exists(), name


def test_a_gguf_the_gguf_reader_rejects_is_named(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    bad = tmp_path / "bad.gguf"  # a plausible header, then a metadata key whose length runs past the file
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + b"\xff" * 200)
    with pytest.raises(ValueError, match=r"bad\.gguf is not a readable GGUF file \(the gguf reader says"):
        check_model(bad)


def test_a_gguf_without_its_loading_packages_is_named_before_loading(tmp_path: Path, monkeypatch) -> None:
    """It was a traceback ending in transformers' ImportError, after a failed run folder was made."""
    import importlib.util

    good = tmp_path / "empty.gguf"  # a whole GGUF header: no tensors, no metadata
    good.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    real_find_spec = importlib.util.find_spec
    specs = {"gguf": None, "accelerate": None}  # None: not installed
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: specs[name] if name in specs else real_find_spec(name, *a),
    )
    assert check_model(good, weights=False) == (tmp_path, "empty.gguf")  # nothing to load: not needed
    with pytest.raises(
        ValueError, match=r"empty\.gguf is a GGUF file; loading it needs the gguf and accelerate package\(s\)"
    ):
        check_model(good)
    specs["gguf"] = real_find_spec("json")  # any spec: "installed"
    with pytest.raises(ValueError, match=r"needs the accelerate package\(s\): pip install -e '\.\[gguf\]'"):
        check_model(good)
    specs["accelerate"] = real_find_spec("json")
    assert check_model(good) == (tmp_path, "empty.gguf")
