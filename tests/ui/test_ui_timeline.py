"""The Timeline page on a real profiled run: phase spans equal the perf records, the trace and the memray
snapshot are listed with their sizes and openers, and the wandb entry of run.json becomes a link."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpolab.cli import build_parser, config_from_args
from grpolab.train.loop import train
from grpolab.ui import timeline
from grpolab.ui.runstore import RunStore

APP = Path(__file__).resolve().parents[2] / "ui" / "app.py"
FLAGS = ["--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2"]
FLAGS += ["--rollout-max-response-len", "8", "--no-progress", "--eval-interval", "1"]
FLAGS += [
    "--eval-prompt-data",
    "arith",
    str(Path(__file__).resolve().parents[2] / "fixtures" / "data" / "arithmetic_train.jsonl"),
]
FLAGS += [
    "--eval-max-prompts",
    "2",
    "--use-pytorch-profiler",
    "--profile-step-start",
    "0",
    "--profile-step-end",
    "1",
]


@pytest.fixture(scope="module")
def profiled_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RUNS_ROOT with `prof`: rollout 0 profiled, a memray snapshot after rollout 0, evals, and an online
    wandb run added to run.json as monitor/hub.py writes it."""
    pytest.importorskip("memray")
    root = tmp_path_factory.mktemp("timeline")
    argv = ["train", *FLAGS, "--record-memory-history", "--memory-recorder", "memray"]
    argv += ["--run-dir", "prof"]  # relative: the events must still name the files absolutely
    cwd = Path.cwd()
    os.chdir(root)
    try:
        train(config_from_args(build_parser().parse_args(argv)), ["grpolab", *argv])
    finally:
        os.chdir(cwd)
    run_json = root / "prof" / "run.json"
    body = json.loads(run_json.read_text())
    body["wandb"] = {
        "id": "abc123",
        "project": "grpolab",
        "mode": "online",
        "url": "https://wandb.ai/u/grpolab/runs/abc123",
    }
    run_json.write_text(json.dumps(body))
    return root


def test_phase_spans_equal_perf_records(profiled_root: Path) -> None:
    store = RunStore([profiled_root])
    frame = store.frame("prof")
    spans = timeline.phase_spans(frame)
    perf = frame.xs("perf", level="kind")
    assert sorted(spans["rollout_id"].unique()) == [0, 1]
    for rollout_id, rec in perf.iterrows():
        mine = spans[spans["rollout_id"] == rollout_id].set_index("phase")
        for phase in ("rollout", "actor_train", "update_weights", "eval"):  # log_probs: rollout 0 only
            assert mine.loc[phase, "seconds"] == pytest.approx(rec[f"perf/{phase}_time"])
        inside = mine.drop(index="eval")
        assert inside["seconds"].sum() == pytest.approx(rec["perf/step_time"])  # `other` fills the rest
        assert inside["end"].max() == pytest.approx(rec["time"])
        assert mine.loc["eval", "end"] == pytest.approx(inside["start"].min())  # eval just before its step
        assert list(inside.index[:2]) == ["rollout", "engine_release"]


def test_artifacts_and_wandb_link(profiled_root: Path) -> None:
    store = RunStore([profiled_root])
    items = timeline.artifacts(store.run_path("prof"), store.read_events("prof"))
    trace = profiled_root / "prof" / "profile" / "rank0.train_overall.rollout0.pt.trace.json.gz"
    snap = profiled_root / "prof" / "memory" / "memray-rank0.bin"
    assert [(a.kind, a.path, a.event) for a in items] == [
        ("memray", snap, "memory_snapshot"),  # after rollout 0's training, before its iteration ends
        ("trace", trace, "profiler_trace"),
    ]
    assert [a.bytes for a in items] == [snap.stat().st_size, trace.stat().st_size]
    paths = [
        e["path"] for e in store.read_events("prof") if e["event"] in ("profiler_trace", "memory_snapshot")
    ]
    assert sorted(paths) == sorted([str(snap), str(trace)])  # absolute, though --run-dir was relative
    assert items[0].command == f"memray flamegraph {snap}"
    assert timeline.wandb_link({}) is None
    assert timeline.wandb_link({"wandb": {"id": "x1", "mode": "offline", "dir": "/w/run-x1"}}) == (
        "wandb run x1 (offline): `wandb sync /w/run-x1`"
    )
    link = timeline.wandb_link(store.read_run_json("prof"))
    assert link == "[wandb run abc123](https://wandb.ai/u/grpolab/runs/abc123)"
    torch_snap = timeline.artifacts(
        Path("/nonexistent"), [{"event": "memory_snapshot", "path": "/x/oom-rank0-rollout3.pickle"}]
    )
    assert torch_snap[0].bytes is None
    assert (
        torch_snap[0].command
        == "python -m torch.cuda._memory_viz trace_plot /x/oom-rank0-rollout3.pickle -o /x/oom-rank0-rollout3.html"
    )


def test_old_relative_event_paths_are_found_by_name_once(profiled_root: Path, tmp_path: Path) -> None:
    """An event written before paths were absolute names the file relative to the command's cwd
    ("runs/prof/profile/..."): it is found by name in the run directory and listed once, and files of
    another rank in --tensorboard-dir (run.json's config) are listed too."""
    run_dir = profiled_root / "prof"
    name = "rank0.train_overall.rollout0.pt.trace.json.gz"
    old = [{"event": "profiler_trace", "path": f"runs/prof/profile/{name}"}]
    items = timeline.artifacts(run_dir, old)
    assert [(a.path, a.event) for a in items if a.kind == "trace"] == [
        (run_dir / "profile" / name, "profiler_trace")
    ]
    assert len(items) == 2 and all(a.bytes is not None for a in items)
    gone = timeline.artifacts(
        run_dir, [{"event": "profiler_trace", "path": "runs/x/rank3.a.pt.trace.json.gz"}]
    )
    assert gone[0].path == Path("runs/x/rank3.a.pt.trace.json.gz") and gone[0].bytes is None
    tb = tmp_path / "tb"
    tb.mkdir()
    (tb / "rank1.train_overall.rollout0.pt.trace.json.gz").write_bytes(b"x" * 7)
    folders = timeline.artifact_folders({"config": {"monitoring": {"tensorboard_dir": str(tb)}}})
    assert folders == [tb]
    listed = timeline.artifacts(run_dir, [], folders)
    assert (tb / "rank1.train_overall.rollout0.pt.trace.json.gz", 7) in [(a.path, a.bytes) for a in listed]


def test_timeline_page_renders(profiled_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPOLAB_UI_ROOTS", str(profiled_root))
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.switch_page("app_pages/timeline.py").run()
    assert not at.exception
    at.selectbox(key="timeline_run").set_value("prof").run()
    assert not at.exception
    assert "[wandb run abc123](https://wandb.ai/u/grpolab/runs/abc123)" in [m.value for m in at.markdown]
    tables = [d.value for d in at.dataframe]
    totals = next(t for t in tables if "share" in t.columns).set_index("phase")
    perf = RunStore([profiled_root]).frame("prof").xs("perf", level="kind")
    assert totals.loc["actor_train", "seconds"] == pytest.approx(perf["perf/actor_train_time"].sum())
    files = next(t for t in tables if "open with" in t.columns)
    assert list(files["kind"]) == ["memray", "trace"]
    assert files["open with"].iloc[0].startswith("memray flamegraph ")
    assert len(at.get("plotly_chart")) == 1
