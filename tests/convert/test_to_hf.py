"""`grpolab convert --to-hf` (convert/to_hf.py): a checkpoint of a short run becomes a save_pretrained folder
that transformers loads to the trainer's log-probs, that `grpolab train` and `grpolab serve` take, and a
checkpoint that does not map is refused naming the tensor, without touching an existing folder."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from runs import train_short
from safetensors.torch import load_file, save_file

from grpolab.cli import main
from grpolab.core.atomic import current_umask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "serve"))  # serving.start_server
from serving import start_server, stop_server  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "tiny-qwen3"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("convert")
    train_short(tmp / "run", "--save", str(tmp / "ckpt"))
    return tmp / "ckpt" / "iter_0000002"


def test_export_loads_to_the_trainers_weights_and_runs(ckpt: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "hf"
    assert (
        main(["convert", "--to-hf", str(ckpt.parent), "--output-dir", str(out)]) == 0
    )  # origin: the checkpoint's
    capsys.readouterr()
    # weights that certainly differ from the origin's (a 2-rollout run may not move them)
    ckpt = _copy_with(
        ckpt, tmp_path, lambda w: w.__setitem__("model.norm.weight", w["model.norm.weight"] * 1.5)
    )
    out = tmp_path / "hf_moved"
    assert main(["convert", "--to-hf", str(ckpt), "--output-dir", str(out)]) == 0
    said = capsys.readouterr().out
    assert "tied lm_head.weight" in said and "bitwise on 12 positions" in said
    facts = json.loads((out / "grpolab_export.json").read_text())
    assert facts["next_rollout_id"] == 2 and facts["tied"] == ["lm_head.weight"]
    trained, exported = load_file(str(ckpt / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(exported) <= set(trained) and all(torch.equal(exported[k], trained[k]) for k in exported)
    assert not torch.equal(
        trained["model.norm.weight"], load_file(str(TINY / "model.safetensors"))["model.norm.weight"]
    )
    assert {"config.json", "tokenizer.json", "chat_template.jinja", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    train_short(tmp_path / "again", "--hf-checkpoint", str(out), "--num-rollout", "1")
    server = start_server(out)
    try:
        answer = server.call("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
        assert answer.status == 200 and len(answer.body["output_ids"]) >= 1
    finally:
        stop_server(server)


def _copy_with(ckpt: Path, tmp: Path, edit) -> Path:  # noqa: ANN001
    copy = shutil.copytree(ckpt, tmp / "edited")
    weights = {k: v.clone() for k, v in load_file(str(copy / "model.safetensors")).items()}
    edit(weights)
    save_file(weights, str(copy / "model.safetensors"))
    return copy


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda w: w.__setitem__("extra.weight", torch.zeros(2)), "checkpoint tensor extra.weight names no parameter"),
        (lambda w: w.pop("model.norm.weight"), "no checkpoint tensor for the origin's model.norm.weight"),
        (lambda w: w.__setitem__("lm_head.weight", w["model.embed_tokens.weight"].clone()),
         "are one tied parameter of the origin model"),
        (lambda w: w.__setitem__("model.norm.weight", torch.zeros(3)), "checkpoint tensor model.norm.weight has shape (3,)"),
    ],
)  # fmt: skip
def test_a_checkpoint_that_does_not_map_is_refused_naming_the_tensor(
    ckpt, tmp_path, capsys, edit, message
) -> None:
    bad = _copy_with(ckpt, tmp_path, edit)
    assert (
        main(
            [
                "convert",
                "--to-hf",
                str(bad),
                "--output-dir",
                str(tmp_path / "out"),
                "--origin-hf-dir",
                str(TINY),
            ]
        )
        == 2
    )
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_bad_input_exits_2_and_loses_nothing(ckpt: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    argv = ["convert", "--to-hf", str(ckpt), "--output-dir", str(out), "--origin-hf-dir", str(TINY)]
    assert main(argv) == 2 and "is not empty; pass --force" in capsys.readouterr().err
    assert (out / "mine.txt").read_text() == "keep me"
    other = REPO / "fixtures" / "tiny-qwen3-tools"
    assert (
        main(
            [
                "convert",
                "--to-hf",
                str(ckpt),
                "--output-dir",
                str(tmp_path / "o2"),
                "--origin-hf-dir",
                str(other),
            ]
        )
        == 2
        and "trained from another model" in capsys.readouterr().err
    )
    assert (out / "mine.txt").exists()
    assert main(["convert", "--to-hf", str(tmp_path / "none"), "--output-dir", str(tmp_path / "o")]) == 2
    assert "no checkpoint there" in capsys.readouterr().err
    cut = shutil.copytree(ckpt, tmp_path / "cut")
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:1000])
    assert (
        main(
            [
                "convert",
                "--to-hf",
                str(cut),
                "--output-dir",
                str(tmp_path / "o"),
                "--origin-hf-dir",
                str(TINY),
            ]
        )
        == 2
    )
    assert "model.safetensors is unreadable" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 2  # --force replaces an earlier export, not someone's folder
    assert (
        "holds no grpolab_export.json of an export: --force replaces an earlier export only"
        in capsys.readouterr().err
    )
    assert (out / "mine.txt").read_text() == "keep me"
    export = tmp_path / "export"
    again = ["convert", "--to-hf", str(ckpt), "--output-dir", str(export), "--origin-hf-dir", str(TINY)]
    assert main(again) == 0 and main([*again, "--force"]) == 0 and (export / "grpolab_export.json").is_file()
    assert (
        export.stat().st_mode & 0o777 == 0o777 & ~current_umask()
    )  # readable for serving, not mkdtemp's 0700
    (out / "grpolab_export.json").write_text("")  # a marker by name alone is not an export: mine.txt stays
    assert (
        main([*argv, "--force"]) == 2
        and "holds no grpolab_export.json of an export" in capsys.readouterr().err
    )
    assert (out / "mine.txt").read_text() == "keep me"


def test_force_never_replaces_the_working_directory_or_the_origin_model(
    ckpt: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """`.` and `..` are the folders they name (once `.` emptied the working directory and failed with
    errno 22), and the origin model is never the output, even when it is an earlier export."""
    origin = shutil.copytree(TINY, tmp_path / "origin")
    (origin / "grpolab_export.json").write_text("{}")  # an export trained on again: still the origin
    inner = tmp_path / "work" / "inner"
    inner.mkdir(parents=True)
    (inner / "notes.txt").write_text("mine")
    monkeypatch.chdir(inner)
    for out, needle in ((".", "is or holds the working directory"), ("..", "is or holds the working directory"),
                        (str(origin), "is or holds the origin model")):  # fmt: skip
        argv = [
            "convert",
            "--to-hf",
            str(ckpt),
            "--output-dir",
            out,
            "--origin-hf-dir",
            str(origin),
            "--force",
        ]
        assert main(argv) == 2 and needle in capsys.readouterr().err, out
    assert (inner / "notes.txt").read_text() == "mine" and (origin / "config.json").is_file()


def test_force_never_replaces_the_checkpoint_and_a_bad_state_file_is_named(
    ckpt: Path, tmp_path: Path, capsys
) -> None:
    """--force replaces an earlier export, never the checkpoint or the run holding it; a trainer_state.json
    that is not an object or is cut short is named, as --load names it."""
    run = tmp_path / "run"
    source = shutil.copytree(ckpt.parent, run / "ckpt") / ckpt.name
    (run / "metrics.jsonl").write_text("keep\n")
    for out, where in ((run, "is a folder holding the checkpoint"), (source, "is the checkpoint"),
                       (source / "hf", "is inside the checkpoint")):  # fmt: skip
        argv = [
            "convert",
            "--to-hf",
            str(source),
            "--output-dir",
            str(out),
            "--origin-hf-dir",
            str(TINY),
            "--force",
        ]
        assert main(argv) == 2 and where in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == "keep\n" and (source / "model.safetensors").is_file()
    afile = tmp_path / "afile.txt"
    afile.write_text("mine")
    assert main(["convert", "--to-hf", str(source), "--output-dir", str(afile), "--force"]) == 2
    assert "is a file; expected a directory" in capsys.readouterr().err and afile.read_text() == "mine"
    state = source / "trainer_state.json"
    good = json.loads(state.read_text())
    cases = [("[]", "should hold a JSON object, found list"), (state.read_text()[:50], "is not valid JSON"),
             (json.dumps({**good, "hf_checkpoint": 5}), "hf_checkpoint should be str or null, found 5"),
             (json.dumps({**good, "next_rollout_id": "two"}), 'next_rollout_id should be int, found "two"')]  # fmt: skip
    for text, needle in cases:
        state.write_text(text)
        assert main(["convert", "--to-hf", str(source), "--output-dir", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert f"--to-hf: {state}" in err and needle in err and "Traceback" not in err
