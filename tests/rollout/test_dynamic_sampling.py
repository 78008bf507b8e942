"""Dynamic sampling with over-sampling (rollout/dynamic_path.py, rollout/filters.py, rollout/ledger.py):
the trained batch is exactly the kept groups, the ledger accounts for every generated group, a replay
of a filtered run is bitwise, and a filter that breaks its contract fails the run naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from runs import events, metrics, train_short

from grpolab.cli import main
from grpolab.replay.recording import load_rollout

NONZERO = "grpolab.rollout.filters.check_reward_nonzero_std"
BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "16"]


@pytest.fixture(scope="module")
def filtered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("dynamic") / "run"
    return train_short(run_dir, *BASE, "--num-rollout", "2", "--dynamic-sampling-filter-path", NONZERO,
                       "--over-sampling-batch-size", "6", "--save-debug-rollout-data",
                       str(run_dir / "{rollout_id}.grz"), "--save", str(run_dir / "ckpt"))  # fmt: skip


def test_the_trained_batch_is_exactly_the_kept_groups(filtered: Path) -> None:
    lines = metrics(filtered, "rollout")
    for rollout_id, line in enumerate(lines):
        samples = load_rollout(filtered / f"{rollout_id}.grz").samples
        assert [s.index for s in samples] == list(range(16)) and [s.group_index for s in samples] == [
            g for g in range(4) for _ in range(4)
        ]
        for g in range(4):
            rewards = torch.tensor([s.reward for s in samples if s.group_index == g], dtype=torch.float64)
            assert rewards.std() > 1e-6  # no zero-std group was trained
        assert line["rollout/raw_reward"] == pytest.approx(sum(s.reward for s in samples) / 16)
        assert line["rollout/zero_std/all_zero_percentage"] == 0.0
        assert sum(abs(s.advantage) for s in samples) > 0


def test_the_ledger_accounts_for_every_generated_group(filtered: Path) -> None:
    for line, event in zip(metrics(filtered, "rollout"), events(filtered, "ledger"), strict=True):
        drops = sum(v for k, v in line.items() if k.startswith("rollout/dynamic_filter/drop_"))
        assert all(k.startswith("rollout/dynamic_filter/drop_zero_std_") for k in line if "drop_" in k)
        assert line["rollout/ledger/kept_groups"] == 4 == event["kept"]["groups"]
        generated = line["rollout/ledger/generated_groups"]
        assert generated == 6 * line["rollout/ledger/rounds"] == event["generated"]["groups"]
        assert generated == 4 + drops + line["rollout/ledger/surplus_groups"]
        tokens = ("kept", "filtered", "surplus")
        assert line["rollout/ledger/generated_tokens"] == sum(
            line[f"rollout/ledger/{t}_tokens"] for t in tokens
        )
        assert event["kept"]["tokens"] == line["rollout/ledger/kept_tokens"]


def test_the_checkpoint_keeps_the_prompt_streams_position(filtered: Path) -> None:
    """Over-sampled rounds draw more prompts than rollouts x --rollout-batch-size: the position saved is
    the prompts drawn (Miles' data source offset), so a resumed run draws the next ones."""
    rounds = sum(line["rollout/ledger/rounds"] for line in metrics(filtered, "rollout"))
    state = json.loads((filtered / "ckpt" / "iter_0000002" / "trainer_state.json").read_text())
    assert state["data_position"] == rounds * 6 > 2 * 4


def test_resuming_a_filtered_checkpoint_without_the_filter_is_refused(
    filtered: Path, tmp_path: Path, capsys
) -> None:
    """Its prompt stream is past rollout x --rollout-batch-size: a plain run would redraw used prompts."""
    argv = ["train", *BASE, "--num-rollout", "3", "--load", str(filtered / "ckpt" / "iter_0000002"),
            "--run-dir", str(tmp_path / "plain")]  # fmt: skip
    assert main(argv) == 2
    assert "it was saved by a run that drew prompts by dynamic sampling" in capsys.readouterr().err


def test_a_replay_of_a_filtered_run_is_bitwise(filtered: Path, tmp_path: Path) -> None:
    replay = train_short(tmp_path / "replay", *BASE, "--num-rollout", "2", "--load-debug-rollout-data",
                         str(filtered / "{rollout_id}.grz"), "--debug-train-only")  # fmt: skip
    keys = ("train/loss", "train/grad_norm", "train/pg_loss")
    assert [[m[k] for k in keys] for m in metrics(replay, "step")] == [
        [m[k] for k in keys] for m in metrics(filtered, "step")
    ]


def test_a_filter_that_keeps_too_little_ends_the_run_with_the_ledger(tmp_path: Path) -> None:
    run_dir = tmp_path / "never"
    with pytest.raises(
        RuntimeError, match=r"kept 0 of the 4 groups rollout 0 needs in --max-refill-rounds 2"
    ):
        train_short(run_dir, *BASE, "--dynamic-sampling-filter-path", "filter_funcs.keep_nothing",
                    "--max-refill-rounds", "2")  # fmt: skip
    (ledger,) = events(run_dir, "ledger")
    assert (
        ledger["rounds"] == 2 and ledger["filtered"]["never"]["groups"] == 8 and ledger["kept"]["groups"] == 0
    )
    assert ledger["never_trained_count"] == 8
    assert events(run_dir, "status")[-1]["status"] == "failed"


def test_a_bool_filter_and_a_drop_without_a_reason(tmp_path: Path) -> None:
    for name in ("keep_even_rows", "drop_without_reason"):
        run_dir = train_short(tmp_path / name, *BASE, "--num-rollout", "1", "--dynamic-sampling-filter-path",
                              f"filter_funcs.{name}", "--over-sampling-batch-size", "8")  # fmt: skip
        (line,) = metrics(run_dir, "rollout")
        drops = {k: v for k, v in line.items() if "drop_" in k}
        assert drops == {"rollout/dynamic_filter/drop_unspecified": line["rollout/ledger/filtered_groups"]}
        assert line["rollout/ledger/kept_groups"] == 4


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raises", "filter_funcs.raises on the group of prompt row"),
        ("wrong_shape", "returned dict {'keep': True}: expected a bool or a DynamicFilterOutput"),
    ],
)
def test_a_broken_filter_fails_the_run_naming_it(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(RuntimeError) as error:
        train_short(tmp_path / "run", *BASE, "--dynamic-sampling-filter-path", f"filter_funcs.{name}")
    assert message in str(error.value)
    if name == "raises":
        assert "filter_funcs.py:" in str(error.value) and "TypeError" in str(error.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dynamic-sampling-filter-path", "filter_funcs.nothing"], "module 'filter_funcs' has no attribute"),
        (["--dynamic-sampling-filter-path", "no_such_module.fn"], "cannot import module 'no_such_module'"),
        (["--dynamic-sampling-filter-path", "filter_funcs.is_async"], "must be a plain function"),
        (["--dynamic-sampling-filter-path", "filter_funcs.one_argument"], "must be `fn(args, samples, **kwargs)`"),
        (["--dynamic-sampling-filter-path", NONZERO, "--over-sampling-batch-size", "3"],
         "--over-sampling-batch-size 3 must be >= --rollout-batch-size 4"),
        (["--over-sampling-batch-size", "8"], "--over-sampling-batch-size needs --dynamic-sampling-filter-path"),
        (["--dynamic-sampling-filter-path", NONZERO, "--max-refill-rounds", "0"], "--max-refill-rounds must be >= 1"),
    ],
)  # fmt: skip
def test_dynamic_sampling_bad_input_exits_2(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    """Before the run directory (the filter is imported with the other user functions)."""
    try:
        code = main(["train", *BASE, *extra, "--run-dir", str(tmp_path / "run")])
    except SystemExit as e:
        code = e.code
    assert code == 2 and not (tmp_path / "run").exists()
    assert message in capsys.readouterr().err


def _replay_filter(capsys, template: str, name: str) -> tuple[int, dict]:
    code = main(["replay", "filter", template, "--filter", name, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out else {}


def test_replay_filter_lists_the_groups_another_filter_would_flip(filtered: Path, capsys) -> None:
    template = str(filtered / "{rollout_id}.grz")
    ledgers = events(filtered, "ledger")
    generated = sum(e["generated"]["groups"] for e in ledgers)
    code, same = _replay_filter(capsys, template, NONZERO)
    assert code == 0 and same["flips"] == [] and same["groups"] == generated and same["notes"] == []
    code, lenient = _replay_filter(capsys, template, "grpolab.rollout.filters.check_no_aborted")
    dropped = sum(t["groups"] for e in ledgers for t in e["filtered"].values())
    assert code == 1 and len(lenient["flips"]) == dropped > 0
    for flip in lenient["flips"]:
        assert flip["was"].startswith("drop (zero_std_") and flip["now"] == "keep"
        assert len(set(flip["rewards"])) == 1  # the zero-std groups the run dropped
    code, strict = _replay_filter(capsys, template, "filter_funcs.keep_nothing")
    assert code == 1 and len(strict["flips"]) == generated - dropped
    other = filtered / "copied"
    other.mkdir()
    (other / "candidates_5.grz").write_bytes((filtered / "candidates_1.grz").read_bytes())  # a renamed copy
    assert main(["replay", "filter", str(other / "{rollout_id}.grz"), "--filter", NONZERO]) == 2
    assert "its header is rollout 'candidates_1', not rollout 5" in capsys.readouterr().err
    assert {f["now"] for f in strict["flips"]} == {"drop (never)"}


def test_replay_filter_on_a_run_without_candidates_says_so(tmp_path: Path, capsys) -> None:
    run_dir = train_short(tmp_path / "plain", *BASE, "--num-rollout", "1", "--save-debug-rollout-data",
                          str(tmp_path / "plain" / "r{rollout_id}.grz"))  # fmt: skip
    code, report = _replay_filter(capsys, str(run_dir / "r{rollout_id}.grz"), NONZERO)
    assert report["notes"] == ["rollout 0: only its kept groups are recorded (no candidates_0)"]
    assert report["groups"] == 4 and code == (1 if report["flips"] else 0)


@pytest.mark.parametrize(
    ("template", "name", "message"),
    [
        ("/nonexistent/{rollout_id}.grz", NONZERO, "no recording matches"),
        ("/nonexistent/r.grz", NONZERO, "{rollout_id}"),
        (None, "filter_funcs.nothing", "module 'filter_funcs' has no attribute 'nothing'"),
    ],
)
def test_replay_filter_bad_input_exits_2(
    filtered: Path, capsys, template: str | None, name: str, message: str
) -> None:
    template = template or str(filtered / "{rollout_id}.grz")
    assert main(["replay", "filter", template, "--filter", name]) == 2
    assert message in capsys.readouterr().err
