"""`grpolab replay convert` and `grpolab replay inspect`."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from replay_helpers import build_samples, make_dump

from grpolab.replay.cli import add_replay_parser, main, run_replay_command
from grpolab.replay.recording import load_rollout, save_rollout


class Custom:
    """Any non-allowlisted class makes a dump unreadable with weights_only=True."""


FP = {"model_fingerprint": "a" * 64, "tokenizer_fingerprint": "b" * 64, "chat_template_hash": "c" * 64}


def _record(path: Path, vocab: int | None = None) -> list:
    samples = build_samples(8, group=4)
    if vocab:
        for s in samples:
            s.prompt_ids = [t % vocab for t in s.prompt_ids]
            s.response_ids = [t % vocab for t in s.response_ids]
    sampler = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 24}
    save_rollout(
        path,
        samples,
        rollout_id=4,
        weight_version=4,
        run_seed=9,
        sampler=sampler,
        fingerprints=FP,
        train_config={"lr": 1e-6},
    )
    return samples


def test_convert_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(make_dump(), tmp_path / "r.pt")
    assert (
        main(["replay", "convert", str(tmp_path / "r.pt"), str(tmp_path / "r.grz"), "--reward-key", "acc"])
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    rec = load_rollout(tmp_path / "r.grz")
    assert rec.rollout_id == 5 and len(rec.samples) == 5 and rec.samples[1].response_ids == [14, 15]


def test_convert_via_python_m(tmp_path: Path) -> None:
    torch.save(make_dump(), tmp_path / "r.pt")
    cmd = [
        sys.executable,
        "-m",
        "grpolab.replay.cli",
        "convert",
        str(tmp_path / "r.pt"),
        str(tmp_path / "r.grz"),
        "--reward-key",
        "fmt",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert load_rollout(tmp_path / "r.grz").samples[2].reward == 0.5


def test_convert_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump()
    dump["metadata"] = {"x": Custom()}
    torch.save(dump, tmp_path / "custom.pt")
    assert main(["convert", str(tmp_path / "custom.pt"), str(tmp_path / "o.grz")]) == 2
    err = capsys.readouterr().err
    assert "grpolab replay convert: error:" in err and "Custom" in err
    torch.save(make_dump(), tmp_path / "r.pt")
    assert (
        main(["convert", str(tmp_path / "r.pt"), str(tmp_path / "o.grz")]) == 2
    )  # dict reward, no --reward-key
    assert "--reward-key" in capsys.readouterr().err
    assert not (tmp_path / "o.grz").exists()


def test_convert_refuses_to_replace_a_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(make_dump(), tmp_path / "r.pt")
    _record(tmp_path / "old.grz")
    before = (tmp_path / "old.grz").read_bytes()
    argv = ["convert", str(tmp_path / "r.pt"), str(tmp_path / "old.grz"), "--reward-key", "acc"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"grpolab replay convert: error: {tmp_path / 'old.grz'} already exists; pass --force to replace it"
        in err
    )
    assert (tmp_path / "old.grz").read_bytes() == before
    assert main([*argv, "--force"]) == 0
    assert load_rollout(tmp_path / "old.grz").rollout_id == 5  # the converted dump replaced rollout 4


def test_inspect_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = _record(tmp_path / "r.grz")
    assert main(["inspect", str(tmp_path / "r.grz")]) == 0
    out = capsys.readouterr().out
    assert sum(s.reward for s in samples) / len(samples) == 0.375
    assert "reward: mean 0.375  min 0  max 1" in out
    assert "group 0: n=4  mean 0.5  min 0  max 1" in out and "group 1: n=4  mean 0.25  min 0  max 1" in out
    lengths = [s.response_length for s in samples]
    assert (
        f"response length (tokens): mean {sum(lengths) / 8:.6g}  min {min(lengths)}  max {max(lengths)}"
        in out
    )
    assert "truncated: 2/8 (25.0%)" in out
    assert "rollout id: 4   weight version: 4" in out and "samples: 8 in 2 groups" in out
    assert "recorded by: (not recorded)" in out  # saved without a run identity
    assert "temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=24" in out
    assert f"tokenizer_fingerprint: {'b' * 64}" in out and "train_config: lr=1e-06" in out
    assert f"8 distinct over 8 samples, first {samples[0].seed}" in out


def test_inspect_sample_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
) -> None:
    samples = _record(tmp_path / "r.grz", vocab=1024)
    assert main(["inspect", str(tmp_path / "r.grz"), "--sample", "2"]) == 0
    out = capsys.readouterr().out
    s = samples[2]
    assert s.prompt_text in out and s.response_text in out
    rows = [
        line.split()
        for line in out.splitlines()[
            out.splitlines().index(next(x for x in out.splitlines() if x.split()[:2] == ["pos", "token_id"]))
            + 1 :
        ]
    ]
    assert [(int(r[0]), int(r[1]), r[2]) for r in rows] == [
        (i, t, f"{lp:.4f}") for i, (t, lp) in enumerate(zip(s.response_ids, s.rollout_log_probs.tolist()))
    ]
    assert (
        main(["inspect", str(tmp_path / "r.grz"), "--sample", "2", "--tokenizer", str(tiny_model_dir)]) == 0
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = capsys.readouterr().out
    assert "token" in out and repr(tok.decode([s.response_ids[0]])) in out


def test_inspect_miles_pt_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(make_dump(), tmp_path / "r.pt")
    assert main(["inspect", str(tmp_path / "r.pt"), "--reward-key", "acc"]) == 0
    out = capsys.readouterr().out
    assert "samples: 5 in 2 groups" in out and "reward: mean 0.6" in out and "sample seeds: unknown" in out
    assert main(["inspect", str(tmp_path / "absent.grz")]) == 2
    assert "absent.grz: no such recording" in capsys.readouterr().err
    _record(tmp_path / "r.grz")
    assert main(["inspect", str(tmp_path / "r.grz"), "--sample", "8"]) == 2
    assert "--sample 8 is out of range: the recording has 8 samples" in capsys.readouterr().err
    data = (tmp_path / "r.grz").read_bytes()
    (tmp_path / "cut.grz").write_bytes(data[:-10])
    assert main(["inspect", str(tmp_path / "cut.grz")]) == 2
    assert "truncated" in capsys.readouterr().err


def test_wiring_into_a_parent_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="grpolab")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train")
    add_replay_parser(sub)
    _record(tmp_path / "r.grz")
    args = parser.parse_args(["replay", "inspect", str(tmp_path / "r.grz")])
    assert args.command == "replay" and run_replay_command(args) == 0
    assert "samples: 8" in capsys.readouterr().out


def test_convert_never_writes_over_its_input_or_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`convert m.pt m.pt --force` replaced the dump being converted; a directory output said
    "already exists", and with --force `[Errno 21] Is a directory` (issue 15 fix F6)."""
    dump = tmp_path / "m.pt"
    torch.save(make_dump(), dump)
    before = dump.read_bytes()
    (tmp_path / "link.pt").symlink_to(dump)
    (tmp_path / "hard.pt").hardlink_to(dump)
    for out in ("m.pt", "link.pt", "hard.pt"):
        for force in ([], ["--force"]):
            assert main(["convert", str(dump), str(tmp_path / out), "--reward-key", "acc", *force]) == 2
            assert (
                f"grpolab replay convert: error: output {tmp_path / out} is the input file {dump}; "
                "writing it would destroy the dump being converted (even with --force)"
            ) in capsys.readouterr().err
    assert dump.read_bytes() == before
    (tmp_path / "outdir").mkdir()
    for force in ([], ["--force"]):
        assert main(["convert", str(dump), str(tmp_path / "outdir"), "--reward-key", "acc", *force]) == 2
        err = capsys.readouterr().err
        assert f"output {tmp_path / 'outdir'} is a directory; give the .grz file to write, e.g. " in err
        assert str(tmp_path / "outdir" / "m.grz") in err and "Errno" not in err
    assert main(["convert", str(dump), str(tmp_path / "outdir" / "m.grz"), "--reward-key", "acc"]) == 0


@pytest.mark.parametrize("value", ["-1", "x"])
def test_logprobs_rollout_must_be_a_rollout_id(
    tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--rollout -1` looked for `r_-1.grz`; it is a flag error now (exit 2, argparse's usage)."""
    with pytest.raises(SystemExit) as e:
        main(["logprobs", str(tmp_path), "--rollout", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"argument --rollout: expected a rollout id (an integer >= 0), got {value if value == '-1' else repr(value)}"
        in err
    )


def test_a_closed_stdout_ends_any_command_quietly(tmp_path: Path) -> None:
    """`grpolab replay inspect F | head` printed `error: [Errno 32] Broken pipe` (issue 15 fix F6):
    the reader is gone before the command writes; it exits 141 with nothing on stderr."""
    _record(tmp_path / "r.grz")
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpolab", "replay", "inspect", str(tmp_path / "r.grz"), "--sample", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the first line (startup takes far longer)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""
