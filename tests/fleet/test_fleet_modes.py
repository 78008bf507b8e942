"""End to end through the real sglang-router on CPU, two modes of the loop on the HTTP engine: inject mode
(`--ci-inject-rollout-data-path`, the fleet's fresh rollouts compared with an in-process recording) and
`--ci-test`'s weight-update checker (SGLang's `/weights_checker` on every engine), and how the HTTP
engine reads that checker's quoted 400 (fast unit tests)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_fleet_e2e import _train

from grpolab.checkers.weight_update import mismatch_rows
from grpolab.core.engine.http_calls import MAX_QUOTED
from grpolab.core.engine.sglang_api import UNNAMED, parse_mismatches
from grpolab.rundir.reader import read_events

TINY = ["--rollout-max-response-len", "16"]  # with test_fleet_e2e's SMALL: 2 rollouts of 4 prompts x 4


def _events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in read_events(run_dir) if e.get("event") == name]


@pytest.mark.slow
def test_inject_through_the_router_matches_an_in_process_recording(tmp_path: Path) -> None:
    """The fleet regenerates each recorded rollout (same seeds, same synced weights), the inject check
    finds every response token equal, and the run trains on the recording."""
    template = str(tmp_path / "rec" / "r_{rollout_id}.grz")
    recorded = _train(tmp_path / "inproc", *TINY, "--save-debug-rollout-data", template)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    injected = _train(
        tmp_path / "served", *TINY, "--rollout-num-engines", "1", "--ci-inject-rollout-data-path", template
    )
    assert injected.returncode == 0, injected.stderr[-3000:]
    checks = _events(tmp_path / "served", "inject_check")
    assert [(c["rollout_id"], c["mean_ratio"], c["min_ratio"]) for c in checks] == [
        (0, 1.0, 1.0),
        (1, 1.0, 1.0),
    ]
    # the startup sync is version 1, each rollout's sync the next: the served engine echoed the version
    # the trainer sent through /update_weights_from_disk, the one the in-process recording holds
    assert [(c["recorded_weight_version"], c["engine_weight_version"]) for c in checks] == [(1, 1), (2, 2)]
    assert "Router ready" in (tmp_path / "served" / "router.log").read_text()


@pytest.mark.slow
def test_ci_test_runs_the_weight_update_checker_on_the_served_engine(tmp_path: Path) -> None:
    """`--ci-test`'s weight-update checker passes through the fleet; without the first sync (so the
    engine keeps the checker's random tensors) the same check fails the run and counts every tensor the
    in-process engine's check counts (47 on the tiny model, though the quoted 400 names only a few)."""
    run = tmp_path / "ok"
    done = _train(run, *TINY, "--ci-test", "--rollout-num-engines", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = [(e["checker"], e["ok"]) for e in _events(run, "check") if e["checker"] == "weight_update"]
    assert verdicts == [("weight_update", True)]
    assert "Router ready" in (run / "router.log").read_text()

    first_lines = []
    for name, extra in (("skip_inproc", []), ("skip_served", ["--rollout-num-engines", "1"])):
        skipped = _train(tmp_path / name, *TINY, "--ci-test", "--debug-skip-weight-update", *extra)
        assert skipped.returncode == 1, skipped.stderr[-3000:]
        failed = [e for e in _events(tmp_path / name, "check") if e["checker"] == "weight_update"]
        assert len(failed) == 1 and failed[0]["ok"] is False, failed
        first_lines.append(failed[0]["message"].splitlines()[0])
        assert "model.embed_tokens.weight: shape (1024, 128)" in failed[0]["message"]
    assert first_lines[0] == first_lines[1] and "not overwritten bitwise" in first_lines[0], first_lines


QUOTE = "POST http://127.0.0.1:1/weights_checker answered HTTP 400: "


def test_a_quoted_compare_answer_names_its_last_tensor() -> None:
    """The quoted answer is JSON: its last entry ends in `"}`, which was read into the number (ValueError
    instead of the checker's failure when at most 10 tensors differ, e.g. one a sync missed)."""
    body = '{"success":false,"message":"compare: 1 tensors differ from the snapshot: lm_head.weight [10, 8] '
    found = parse_mismatches(QUOTE + body + 'max_abs_err=1.25"}', engine=0, quoted=MAX_QUOTED)
    assert [(m.name, m.shape, m.max_abs_err) for m in found] == [("lm_head.weight", (10, 8), 1.25)]
    assert math.isnan(found[0].mean_abs_err)  # the server reports no mean: none is made up


def test_a_compare_answer_cut_at_the_quote_limit_still_counts_every_tensor() -> None:
    """`call_json` quotes MAX_QUOTED characters of a 400: the "(and K more)" and the entries after the cut
    were lost (6 of 47 tensors reported); the header's count is the total, a cut-short number is dropped."""
    entries = "; ".join(
        f"model.layers.{i}.mlp.up_proj.weight [384, 128] max_abs_err=4.6{i}" for i in range(10)
    )
    body = f'{{"success":false,"message":"compare: 47 tensors differ from the snapshot: {entries} (and 37 more)"}}'
    cut = body[: body.index("max_abs_err=4.65") + len("max_abs_err=4.6")]  # "4.65" cut to "4.6"
    found = parse_mismatches(QUOTE + cut, engine=2, quoted=len(cut))
    assert len(found) == 47
    named = [(m.name, m.max_abs_err) for m in found if m.name != UNNAMED]
    assert named == [(f"engine2/model.layers.{i}.mlp.up_proj.weight", float(f"4.6{i}")) for i in range(5)]


def test_the_checker_prints_the_named_tensors_and_counts_the_others() -> None:
    """47 differing tensors of which the server's answer names 10: 37 lines "<unnamed j>" were printed."""
    entries = "; ".join(
        f"model.layers.{i}.mlp.up_proj.weight [384, 128] max_abs_err=4.6{i}" for i in range(10)
    )
    message = f"compare: 47 tensors differ from the snapshot: {entries} (and 37 more)"
    rows = mismatch_rows(parse_mismatches(message, engine=0)).splitlines()
    assert len(rows) == 11 and rows[0] == (
        "  model.layers.0.mlp.up_proj.weight: shape (384, 128), max abs err 4.6, mean abs err nan"
    )
    assert rows[-1] == "  ... and 37 more tensors differ (the engine names 10)"
    assert (
        mismatch_rows(parse_mismatches(message.replace("47", "10").split(" (and")[0], engine=0)).count("\n")
        == 9
    )  # all named: no count line
