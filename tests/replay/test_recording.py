"""Rollout <-> recording mapping, fingerprints and path templates."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from replay_helpers import build_samples

from grpolab.core.batch import Sample
from grpolab.replay.fingerprints import chat_template_hash, compare_fingerprints, tokenizer_fingerprint
from grpolab.replay.format import RecordingError, decode_container, read_container, write_container
from grpolab.replay.paths import LOAD_FLAG, check_template, eval_rollout_id, format_path
from grpolab.replay.recording import load_rollout, save_rollout

FP = {"model_fingerprint": "m" * 64, "tokenizer_fingerprint": "t" * 64, "chat_template_hash": "c" * 64}
SAMPLER = {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "max_new_tokens": 32}
TRAIN = {"lr": 1e-6, "eps_clip": 0.2, "use_kl_loss": False}


def assert_same_samples(a: list[Sample], b: list[Sample]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name in ("index", "prompt_index", "group_index", "sample_index", "seed", "weight_version"):
            assert getattr(y, name) == getattr(x, name) and type(getattr(y, name)) is int, name
        for name in ("prompt_ids", "response_ids"):
            assert getattr(y, name) == getattr(x, name) and all(type(t) is int for t in getattr(y, name))
        for name in (
            "finish_reason",
            "prompt_text",
            "response_text",
            "label",
            "metadata",
            "reward",
            "advantage",
        ):
            assert getattr(y, name) == getattr(x, name), name
        assert type(y.reward) is float and type(y.advantage) is float
        for name in ("rollout_log_probs", "loss_mask"):
            assert getattr(y, name).dtype == torch.float32 and torch.equal(
                getattr(y, name), getattr(x, name)
            ), name
        if x.kept_token_ids is None:
            assert y.kept_token_ids is None
        else:
            assert len(y.kept_token_ids) == len(x.kept_token_ids)
            for kx, ky in zip(x.kept_token_ids, y.kept_token_ids):
                assert ky.dtype == torch.int64 and torch.equal(kx, ky)


def test_round_trip_samples_and_header(tmp_path: Path) -> None:
    samples = build_samples(24, kept=True)
    samples[3].loss_mask[2] = 0.0
    samples[5].response_ids, samples[5].rollout_log_probs, samples[5].loss_mask = (
        [],
        torch.zeros(0),
        torch.zeros(0),
    )
    samples[5].kept_token_ids = []  # has kept sets, zero tokens
    path = tmp_path / "r.grz"
    n = save_rollout(
        path,
        samples,
        rollout_id=3,
        weight_version=7,
        run_seed=11,
        sampler=SAMPLER,
        fingerprints=FP,
        train_config=TRAIN,
    )
    assert n == path.stat().st_size
    rec = load_rollout(path)
    assert_same_samples(samples, rec.samples)
    assert rec.samples[5].kept_token_ids == []
    assert (rec.rollout_id, rec.weight_version, rec.run_seed, rec.format_version) == (3, 7, 11, 1)
    assert rec.sampler == SAMPLER and rec.train_config == TRAIN and rec.fingerprints == FP
    assert rec.seeds.dtype == np.uint64 and rec.seeds.tolist() == [s.seed for s in samples]
    assert rec.created > 0
    _, arrays = read_container(path)
    assert arrays["loss_mask"].dtype == np.uint8  # 0/1 masks are stored compactly
    assert arrays["rollout_log_probs"].dtype == np.float32 and arrays["finish_reason"].dtype == np.uint8
    assert arrays["reward"].dtype == np.float64 and arrays["advantage"].dtype == np.float64
    assert arrays["has_kept"].tolist() == [s.kept_token_ids is not None for s in samples]


def test_fractional_loss_mask_eval_id_and_empty_rollout(tmp_path: Path) -> None:
    samples = build_samples(4)
    samples[0].loss_mask[0] = 0.25
    save_rollout(
        tmp_path / "e.grz",
        samples,
        rollout_id="eval_2",
        weight_version=1,
        run_seed=0,
        sampler={},
        fingerprints={},
        train_config={},
    )
    rec = load_rollout(tmp_path / "e.grz")
    assert rec.rollout_id == "eval_2" and rec.fingerprints == dict.fromkeys(FP, "")
    assert_same_samples(samples, rec.samples)
    save_rollout(
        tmp_path / "z.grz",
        [],
        rollout_id=0,
        weight_version=0,
        run_seed=0,
        sampler={},
        fingerprints={},
        train_config={},
    )
    assert load_rollout(tmp_path / "z.grz").samples == []


def test_save_rejects_inconsistent_samples(tmp_path: Path) -> None:
    kw = dict(rollout_id=0, weight_version=0, run_seed=0, sampler={}, fingerprints={}, train_config={})
    s = build_samples(2)
    s[1].rollout_log_probs = s[1].rollout_log_probs[:-1]
    with pytest.raises(ValueError, match="sample 1: rollout_log_probs has"):
        save_rollout(tmp_path / "x.grz", s, **kw)
    s = build_samples(2)
    s[0].finish_reason = "abort"
    with pytest.raises(ValueError, match="sample 0: finish_reason 'abort'"):
        save_rollout(tmp_path / "x.grz", s, **kw)
    s = build_samples(2)
    s[1].metadata = {"t": torch.zeros(1)}
    with pytest.raises(ValueError, match="sample 1: metadata is not JSON-serializable"):
        save_rollout(tmp_path / "x.grz", s, **kw)
    with pytest.raises(ValueError, match="unknown fingerprint fields"):
        save_rollout(tmp_path / "x.grz", build_samples(1), **{**kw, "fingerprints": {"model": "x"}})
    assert not (tmp_path / "x.grz").exists()


def test_load_rejects_other_containers(tmp_path: Path) -> None:
    write_container(tmp_path / "o.grz", {"kind": "something-else"}, {})
    with pytest.raises(RecordingError, match=r"o\.grz: not a rollout recording"):
        load_rollout(tmp_path / "o.grz")
    save_rollout(
        tmp_path / "r.grz",
        build_samples(3),
        rollout_id=0,
        weight_version=0,
        run_seed=0,
        sampler={},
        fingerprints={},
        train_config={},
    )
    header, arrays = read_container(tmp_path / "r.grz")
    arrays["response_offsets"][-1] += 1
    write_container(tmp_path / "bad.grz", header, arrays)
    with pytest.raises(RecordingError, match=r"bad\.grz: array 'response_offsets' must run from 0 to"):
        load_rollout(tmp_path / "bad.grz")
    del arrays["seed"]
    write_container(tmp_path / "bad.grz", header, arrays)
    with pytest.raises(RecordingError, match=r"missing arrays \['seed'\]"):
        load_rollout(tmp_path / "bad.grz")


def test_size_vs_torch_save(tmp_path: Path) -> None:
    """64 samples x ~60 tokens, fp32 log-probs: .grz <= 0.35x torch.save of per-sample dicts of tensors."""
    samples = build_samples(64, group=8, prompt_len=20, resp_len=40)
    dicts = [
        {
            "index": s.index, "prompt_index": s.prompt_index, "group_index": s.group_index, "sample_index": s.sample_index,
            "seed": s.seed, "prompt_ids": torch.tensor(s.prompt_ids), "response_ids": torch.tensor(s.response_ids),
            "rollout_log_probs": s.rollout_log_probs, "loss_mask": s.loss_mask, "finish_reason": s.finish_reason,
            "prompt_text": s.prompt_text, "response_text": s.response_text, "label": s.label, "reward": s.reward,
            "advantage": s.advantage, "weight_version": s.weight_version, "metadata": s.metadata,
        }
        for s in samples
    ]  # fmt: skip
    buf = io.BytesIO()
    torch.save({"rollout_id": 0, "samples": dicts}, buf)
    n = save_rollout(
        tmp_path / "r.grz",
        samples,
        rollout_id=0,
        weight_version=0,
        run_seed=0,
        sampler=SAMPLER,
        fingerprints=FP,
        train_config=TRAIN,
    )
    ratio = n / buf.tell()
    print(f"grz {n} B vs torch.save {buf.tell()} B: ratio {ratio:.3f}")
    assert ratio <= 0.35


def test_format_path() -> None:
    assert format_path("/r/rollout_{rollout_id}.grz", 3) == "/r/rollout_3.grz"
    assert format_path("/r/rollout_{rollout_id}.grz", eval_rollout_id(20)) == "/r/rollout_eval_20.grz"
    assert format_path("/r/{{literal}}/{rollout_id}.grz", 0) == "/r/{literal}/0.grz"
    with pytest.raises(
        ValueError, match=r"must contain \{rollout_id\}; without it every rollout overwrites one file"
    ):
        format_path("/r/rollout.grz", 1)
    with pytest.raises(ValueError, match=r"'/r/\{step\}_\{rollout_id\}.grz' has field \{step\}"):
        format_path("/r/{step}_{rollout_id}.grz", 1)
    with pytest.raises(ValueError, match=r"has field \{\}"):
        format_path("/r/{}_{rollout_id}.grz", 1)
    for stray in ("/r/{rollout_id.grz", "/r/{rollout_id}}.grz", "/r/}{rollout_id}", "/r/{rollout_id}/{"):
        with pytest.raises(ValueError, match="stray brace") as e:
            format_path(stray, 1)
        assert repr(stray) in str(e.value)
    with pytest.raises(ValueError, match="has field"):
        format_path("/r/{rollout_id[0]}.grz", 1)
    with pytest.raises(ValueError, match="format spec"):
        format_path("/r/{rollout_id:04d}.grz", 1)
    for bad_id in (-1, True, "3x", "eval_", 1.5):
        with pytest.raises(ValueError, match="rollout id"):
            format_path("/r/{rollout_id}", bad_id)  # type: ignore[arg-type]


def test_a_template_without_rollout_id_is_explained_by_its_flag() -> None:
    """Loading from one file would train every rollout on it; "overwrites" is the saving reason."""
    with pytest.raises(ValueError) as e:
        format_path("/r/rollout.grz", 1, flag=LOAD_FLAG)
    assert "every rollout would train on the same recorded file" in str(e.value)
    assert "overwrites" not in str(e.value)
    from grpolab.core.config.debugging import DebugConfig

    for flag, field, reason in (
        ("--load-debug-rollout-data", "load_debug_rollout_data", "would train on the same recorded file"),
        ("--ci-inject-rollout-data-path", "ci_inject_rollout_data_path", "compared with, and trained on"),
        ("--save-debug-rollout-data", "save_debug_rollout_data", "every rollout overwrites one file"),
    ):
        with pytest.raises(ValueError) as e:
            DebugConfig(**{field: "/tmp/r.grz"})
        assert str(e.value).startswith(f"{flag}: path template '/tmp/r.grz' must contain {{rollout_id}}")
        assert reason in str(e.value)
    with pytest.raises(ValueError, match="^--load-debug-rollout-data: path template .* has field"):
        check_template("/r/{step}_{rollout_id}.grz", flag=LOAD_FLAG)


def test_compare_fingerprints() -> None:
    rec = {**FP, "train_config": {"lr": 1e-6, "eps_clip": 0.2}}
    assert compare_fingerprints(rec, dict(rec)) == []
    cur = {**FP, "tokenizer_fingerprint": "x" * 64, "train_config": {"lr": 2e-6, "kl": 0.1}}
    lines = compare_fingerprints(rec, cur)
    assert lines == [
        f"tokenizer_fingerprint: recording has {'t' * 64!r}, this run has {'x' * 64!r}",
        "train_config.lr: recording has 1e-06, this run has 2e-06",
        "train_config.eps_clip: recording has 0.2, this run has (missing)",
        "train_config.kl: recording has (missing), this run has 0.1",
    ]


def test_tokenizer_fingerprint(tiny_model_dir: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fp = tokenizer_fingerprint(tok)
    assert len(fp) == 64 and fp == tokenizer_fingerprint(AutoTokenizer.from_pretrained(tiny_model_dir))
    tok(["a", "a longer text"], padding=True, truncation=True, max_length=4)  # runtime settings do not count
    assert tokenizer_fingerprint(tok) == fp
    assert tokenizer_fingerprint(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))) == fp
    tok.add_tokens(["<brand_new_token>"])
    assert tokenizer_fingerprint(tok) != fp

    class VocabOnly:
        def get_vocab(self) -> dict[str, int]:
            return {"b": 1, "a": 0}

    assert len(tokenizer_fingerprint(VocabOnly())) == 64
    with pytest.raises(TypeError):
        tokenizer_fingerprint(object())
    h = chat_template_hash(tok)
    assert len(h) == 64 and h == chat_template_hash(AutoTokenizer.from_pretrained(tiny_model_dir))
    tok.chat_template = "{{ messages }}"
    assert chat_template_hash(tok) != h
    tok.chat_template = None
    assert chat_template_hash(tok) == "none"


def test_truncated_rollout_recording_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "r.grz"
    save_rollout(
        path,
        build_samples(2, prompt_len=3, resp_len=4, kept=True),
        rollout_id=1,
        weight_version=1,
        run_seed=0,
        sampler={},
        fingerprints={},
        train_config={},
    )
    data = path.read_bytes()
    for n in range(len(data)):  # every cut, in memory
        with pytest.raises(RecordingError, match="truncated"):
            decode_container(data[:n], name="r.grz")
    cut = tmp_path / "cut.grz"
    for n in [*range(0, 80), *range(80, len(data), 37)]:  # through load_rollout (disk writes are slow here)
        cut.write_bytes(data[:n])
        with pytest.raises(RecordingError, match="truncated"):
            load_rollout(cut)


def test_header_field_types_are_checked(tmp_path: Path) -> None:
    save_rollout(
        tmp_path / "r.grz",
        build_samples(2),
        rollout_id=1,
        weight_version=1,
        run_seed=0,
        sampler={},
        fingerprints={},
        train_config={},
    )
    header, arrays = read_container(tmp_path / "r.grz")
    for key, value, message in (
        ("weight_version", "3", "header weight_version '3' must be of type int"),
        ("rollout_id", "x", "header rollout id"),
    ):
        write_container(tmp_path / "bad.grz", {**header, key: value}, arrays)
        with pytest.raises(RecordingError, match=message):
            load_rollout(tmp_path / "bad.grz")
    with pytest.raises(ValueError, match="rollout id"):
        save_rollout(
            tmp_path / "x.grz",
            [],
            rollout_id="train_3",
            weight_version=0,
            run_seed=0,
            sampler={},
            fingerprints={},
            train_config={},
        )
