"""Bad input found by a fresh-user pass: each gets a clear error naming the flag or file, before work is lost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runs import SMALL, events, run

from grpolab.cli import build_parser, config_from_args, main
from grpolab.core import checkpoint
from grpolab.core.data import PromptDataset
from grpolab.core.modeling import load_tokenizer, model_fingerprint
from grpolab.train.preflight import check_chat_template


def test_model_fingerprint_ignores_where_the_model_lives(tiny_model_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere"
    shutil.copytree(tiny_model_dir, copy)
    assert (
        model_fingerprint(copy)
        == model_fingerprint(tiny_model_dir)
        == model_fingerprint(tiny_model_dir.resolve())
    )
    config = json.loads((copy / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (copy / "config.json").write_text(json.dumps(config))
    assert model_fingerprint(copy) != model_fingerprint(tiny_model_dir)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--load", "/nonexistent/ckpt"], "--load /nonexistent/ckpt: no such directory"),
        (["--seed", "-1"], "--seed must be a non-negative integer"),
        (["--train-dtype", "float16"], "--train-dtype must be one of"),
        (["--device", "cuda"], "--device cuda: this torch build or machine has no CUDA device"),
        (
            ["--rollout-engine", "http"],
            "unknown rollout engine kind 'http' (--rollout-engine); valid: sglang, torch",
        ),
        (["--save", "/dev/null"], "--save /dev/null: exists and is not a directory"),
    ],
)
def test_flags_rejected_at_parse_time(argv: list[str], needle: str, capsys) -> None:
    if argv == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit) as info:
        main(["train", *argv])
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


def test_range_errors_show_the_train_usage(capsys) -> None:
    """A value the config rejects is an error of `grpolab train`, with its usage, not the top-level one."""
    with pytest.raises(SystemExit) as info:
        main(["train", "--engine-failure-timeout", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: grpolab train ") and "usage: grpolab [-h]" not in err
    assert "grpolab train: error: --engine-failure-timeout must be a finite number of seconds > 0" in err
    assert len(err.splitlines()) == 2  # a one-line usage, not every flag
    with pytest.raises(SystemExit):
        main([])
    assert "the following arguments are required: {train," in capsys.readouterr().err


def test_load_and_save_paths(tmp_path: Path, capsys) -> None:
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit):
        main(["train", "--load", str(tmp_path / "a_file")])
    assert "a_file: is a file; expected a checkpoint directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--save", str(tmp_path / "a_file")])
    assert "is a file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # caught before any rollout, not when the first save fails
        main(["train", "--save", str(tmp_path / "a_file" / "ckpt")])
    assert (
        info.value.code == 2
        and "a_file is a file, so the directory cannot be made there" in capsys.readouterr().err
    )
    orphan = tmp_path / "orphan"
    (orphan / "iter_0000002").mkdir(parents=True)
    with pytest.raises(checkpoint.CheckpointError, match="no latest_checkpointed_iteration.txt"):
        checkpoint.find_latest(orphan)
    (orphan / "iter_0000002" / "trainer_state.json").write_text("{}")
    assert (
        checkpoint.find_latest(orphan / "iter_0000002") == orphan / "iter_0000002"
    )  # an iteration dir loads directly


def test_checkpoints_of_another_run_are_not_overwritten_and_corrupt_ones_are_named(
    tmp_path: Path, capsys
) -> None:
    ck = tmp_path / "ck"
    run(tmp_path, "first", "--num-rollout", "1", "--save", str(ck))
    before = (ck / "iter_0000001" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit) as info:  # found before the run directory is made (preflight)
        main(["train", *SMALL, "--save", str(ck), "--seed", "9", "--run-dir", str(tmp_path / "second")])
    assert info.value.code == 2 and "already holds another run's checkpoints" in capsys.readouterr().err
    assert not (tmp_path / "second").exists()
    assert (ck / "iter_0000001" / "model.safetensors").read_bytes() == before
    (ck / "iter_0000001" / "model.safetensors").write_bytes(before[:100])  # truncated
    code = main(
        ["train", *SMALL, "--num-rollout", "2", "--load", str(ck), "--run-dir", str(tmp_path / "third")]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"--load: {ck / 'iter_0000001'} is unreadable" in err
    assert events(tmp_path / "third")[-1]["status"] == "failed"


def test_non_finite_training_stops_before_the_optimizer_step(tmp_path: Path, capsys) -> None:
    code = main(["train", *SMALL, "--num-rollout", "3", "--lr", "1e6", "--run-dir", str(tmp_path / "nan")])
    err = capsys.readouterr().err
    assert code == 1 and "stopped before the optimizer step so the weights stay finite" in err
    assert events(tmp_path / "nan")[-1]["status"] == "failed"


def test_prompt_rows_are_validated_up_front(tiny_model_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    cases = [
        ({"question": "1+1?", "answer": None}, False, "--label-key 'answer': .* line 2 is null"),
        (
            {"question": [{"role": "user", "content": "hi"}], "answer": "1"},
            False,
            "list of chat messages; pass --apply-chat-template",
        ),
        ({"question": "   ", "answer": "1"}, True, "p.jsonl line 2 is an empty prompt"),
    ]
    for bad_row, chat, pattern in cases:
        path = tmp_path / "p.jsonl"
        path.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n" + json.dumps(bad_row) + "\n")
        with pytest.raises(ValueError, match=pattern):
            PromptDataset(path, tok, input_key="question", label_key="answer", apply_chat_template=chat)


# A child process runs each bad command through the CLI, then says whether transformers was imported.
_CHILD = """
import json, sys
from grpolab.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    try:
        code = main(["train", *argv])
    except SystemExit as e:
        code = e.code
    out.append(code)
print(json.dumps({"codes": out, "transformers": "transformers" in sys.modules}))
"""


def test_flag_and_input_errors_come_before_heavy_imports_and_leave_no_run_dir(tmp_path: Path) -> None:
    """Issue 15 items 8 and 13: exit 2 naming the flag, before transformers or a run folder."""
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"question": "caf\u00e9?", "answer": "1"}\n'.encode("latin-1"))
    cases = [
        (["--rm-type", "foo"], "unknown reward function 'foo' (--rm-type); valid: boxed_math, math"),
        (
            ["--custom-rm-path", "no_such_module_x.fn"],
            "--custom-rm-path 'no_such_module_x.fn': cannot import",
        ),
        (["--hf-checkpoint", "/nonexistent"], "--hf-checkpoint: /nonexistent does not exist"),
        (["--prompt-data", str(latin1)], f"--prompt-data: {latin1} line 1 is not UTF-8: byte 0xe9"),
        (["--prompt-data", str(tmp_path)], f"--prompt-data: {tmp_path} is a directory"),
        (
            ["--eval-interval", "1", "--eval-prompt-data", "held", str(tmp_path / "gone.jsonl")],
            f"--eval-prompt-data held: {tmp_path / 'gone.jsonl'} does not exist",
        ),
        (["--lr", "inf"], "argument --lr: must be a finite number, got inf"),
        (["--lr", "nan"], "argument --lr: must be a finite number, got nan"),
    ]
    argvs = [argv for argv, _ in cases]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(argvs)], cwd=tmp_path, capture_output=True, text=True
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {"codes": [2] * len(cases), "transformers": False}, proc.stderr
    for _, needle in cases:
        assert f"grpolab train: error: {needle}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # the default run folder was never made


def test_the_library_entry_checks_inputs_before_the_run_dir(tmp_path: Path) -> None:
    from grpolab.core.config import Config, DataConfig
    from grpolab.core.config.generation import RewardConfig
    from grpolab.train.loop import train

    bad = [
        Config(data=DataConfig(prompt_data=str(tmp_path))),
        Config(reward=RewardConfig(rm_type="foo")),
    ]
    for config in bad:
        config.run.run_dir = str(tmp_path / "run")
        with pytest.raises(ValueError, match="is a directory|unknown reward function"):
            train(config)
        assert not (tmp_path / "run").exists()


def test_the_cli_checks_this_machine_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpolab.train import loop, preflight

    calls = []
    monkeypatch.setattr(preflight, "check_on_this_machine", lambda config: calls.append(config))

    def stop(*args: object, **kwargs: object) -> None:
        raise RuntimeError("stopped before the run directory (test)")

    monkeypatch.setattr(loop.GRPORun, "create", stop)
    assert main(["train", "--num-rollout", "1"]) == 1
    assert len(calls) == 1


def test_a_response_cap_past_the_models_positions_is_refused_before_the_run_dir(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """F4: 10^8 got the process OOM-killed and 2000 ran silently on a 512-position model."""
    limit = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    for length in (100_000_000, limit):
        run_dir = tmp_path / f"r{length}"
        with pytest.raises(SystemExit) as info:
            main(["train", "--rollout-max-response-len", str(length), "--run-dir", str(run_dir)])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "Traceback" not in err
        assert (
            f"--rollout-max-response-len {length}: the response alone reaches the model's limit of {limit}"
            in err
        )
        assert f"max_position_embeddings in {tiny_model_dir}/config.json" in err and not run_dir.exists()


def test_the_longest_prompt_plus_the_response_cap_must_fit_the_model(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """F4: a prompt (counted with tokenizer.json, before the chat template) + the response cap past
    max_position_embeddings is refused naming the prompt's line; a prompt past it alone is named as such."""
    from grpolab.cli import build_parser, config_from_args
    from grpolab.train.preflight import check_inputs

    path = tmp_path / "p.jsonl"  # "apple" x150 is 301 tokens in the tiny tokenizer (word + space pieces)
    path.write_text(
        json.dumps({"question": "1+1?", "answer": "2"})
        + "\n\n"
        + json.dumps({"question": " ".join(["apple"] * 150), "answer": "3"})
        + "\n"
    )
    run_dir = tmp_path / "r"
    with pytest.raises(SystemExit) as info:
        main(
            [
                "train",
                "--prompt-data",
                str(path),
                "--rollout-max-response-len",
                "300",
                "--run-dir",
                str(run_dir),
            ]
        )
    err = capsys.readouterr().err
    assert info.value.code == 2 and not run_dir.exists()
    assert (
        f"--rollout-max-response-len 300: the longest prompt of --prompt-data ({path} line 3) is 301" in err
    )
    assert "301 + 300 exceeds the model's limit of 512 tokens" in err and "use at most 211" in err
    check_inputs(
        config_from_args(build_parser().parse_args(["train", "--prompt-data", str(path)]))
    )  # 301 + 32
    path.write_text(json.dumps({"question": " ".join(["apple"] * 300), "answer": "3"}) + "\n")
    with pytest.raises(ValueError, match=rf"--prompt-data: {path} line 1 is a prompt of 601 tokens"):
        check_inputs(config_from_args(build_parser().parse_args(["train", "--prompt-data", str(path)])))


def test_every_output_path_is_checked_before_the_run_dir(tmp_path: Path, capsys) -> None:
    """fixpaths F3: each gave a raw [Errno 17]/[Errno 2] naming no flag (some after the run started)."""
    dlink, afile = tmp_path / "dlink", tmp_path / "afile"
    dlink.symlink_to(tmp_path / "nowhere")
    afile.write_text("x")
    cases = [
        (["--run-dir", str(dlink)], f"--run-dir {dlink}: {dlink} is a symbolic link to {tmp_path}/nowhere"),
        (["--save", str(dlink / "ck")], f"--save {dlink / 'ck'}: {dlink} is a symbolic link"),
        (["--run-dir", "/proc/x"], "--run-dir /proc/x: cannot make a directory there"),
        (
            ["--save-debug-rollout-data", f"{afile}/r_{{rollout_id}}.grz"],
            f"--save-debug-rollout-data {afile}/r_{{rollout_id}}.grz: {afile} is a file",
        ),
        (
            ["--ci-save-grad-norm", f"{afile}/g/{{role}}_{{rollout_id}}_{{step_id}}.pt"],
            f"--ci-save-grad-norm {afile}/g/{{role}}_{{rollout_id}}_{{step_id}}.pt: {afile} is a file",
        ),
        (["--save-debug-event-data", str(afile)], f"--save-debug-event-data {afile}: is a file"),
        (["--load", str(afile)], f"--load {afile}: is a file; expected a checkpoint directory"),
    ]
    for argv, needle in cases:
        with pytest.raises(SystemExit) as info:
            main(["train", *argv] + ([] if argv[0] == "--run-dir" else ["--run-dir", str(tmp_path / "run")]))
        err = capsys.readouterr().err
        assert info.value.code == 2 and needle in err and "Errno" not in err, (argv, err)
        assert not (tmp_path / "run").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "dlink"]  # no probe folder left


def test_a_run_dir_left_by_a_start_that_failed_before_its_first_rollout_is_reused(
    tmp_path: Path, capsys
) -> None:
    """fixpaths F1: missing recordings failed after the run dir was made, and the corrected command
    was then refused with "--run-dir: X already holds a run"."""
    template = str(tmp_path / "rec" / "r_{rollout_id}.grz")
    run(tmp_path, "rec", "--num-rollout", "1", "--save-debug-rollout-data", template)
    replay = ["train", *SMALL, "--load-debug-rollout-data", template, "--run-dir", str(tmp_path / "replay")]
    assert main([*replay, "--num-rollout", "2"]) == 2
    assert "rollout 1: expected" in capsys.readouterr().err
    assert main([*replay, "--num-rollout", "1"]) == 0
    replayed = tmp_path / "replay"
    starts = [(e["event"], e.get("status"), e.get("failed_starts_before")) for e in events(replayed)]
    assert [s for s in starts if s[0] in ("run_start", "status")] == [
        ("run_start", None, None),
        ("status", "failed", None),
        ("run_start", None, 1),
        ("status", "finished", None),
    ]
    meta = json.loads((replayed / "run.json").read_text())
    assert meta["config"]["rollout"]["num_rollout"] == 1 and len(meta["starts"]) == 2
    assert main(["gate", str(replayed)]) == 0


def test_the_default_run_dir_folder_is_checked_too(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a folder")
    with pytest.raises(SystemExit) as info:
        main(["train"])
    assert (
        info.value.code == 2
        and "--run-dir (default) runs is a file; expected a directory" in capsys.readouterr().err
    )


def test_a_model_without_a_chat_template_is_named_before_any_run_dir(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    bare = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, bare)
    (bare / "chat_template.jinja").unlink()
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(
            ["train", "--hf-checkpoint", str(bare), "--run-dir", str(run_dir)]
        )  # the built-in set: template on
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert f"--apply-chat-template: the tokenizer of --hf-checkpoint {bare} has no chat template" in err
    assert "--no-apply-chat-template" in err and not run_dir.exists()
    # a template in tokenizer_config.json counts, as it does for transformers
    config = json.loads((bare / "tokenizer_config.json").read_text())
    template = (tiny_model_dir / "chat_template.jinja").read_text()
    (bare / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    assert load_tokenizer(bare).chat_template == template
    check_chat_template(config_from_args(build_parser().parse_args(["train", "--hf-checkpoint", str(bare)])))
    run(tmp_path, "templated", "--hf-checkpoint", str(bare), "--num-rollout", "1")
