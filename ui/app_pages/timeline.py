"""Timeline: one run's steps phase by phase (from its perf records), its profiler traces and memory
snapshots with the command that opens each, and its wandb run."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from grpolab.ui import state, timeline


def _chart(spans: pd.DataFrame) -> None:
    """A Gantt chart: one row per rollout, one bar per phase, on the wall clock."""
    shown = spans.assign(
        start=pd.to_datetime(spans["start"], unit="s"),
        end=pd.to_datetime(spans["end"], unit="s"),
        rollout=spans["rollout_id"].map(lambda r: f"rollout {r}"),
    )
    fig = px.timeline(
        shown,
        x_start="start",
        x_end="end",
        y="rollout",
        color="phase",
        hover_data={"seconds": ":.3f", "start": False, "end": False},
    )
    fig.update_yaxes(autorange="reversed", title=None)
    fig.update_layout(height=120 + 28 * spans["rollout_id"].nunique(), legend_title_text="phase")
    st.plotly_chart(fig, key="timeline_chart")


def _totals(spans: pd.DataFrame) -> pd.DataFrame:
    """Seconds per phase over the run, largest first, with each phase's share."""
    totals = spans.groupby("phase")["seconds"].sum().sort_values(ascending=False)
    return pd.DataFrame(
        {"phase": totals.index, "seconds": totals.values, "share": totals.values / totals.sum()}
    )


def _files(items: list[timeline.Artifact]) -> None:
    rows = [
        {
            "kind": a.kind,
            "file": str(a.path),
            "MB": None if a.bytes is None else round(a.bytes / 1e6, 3),
            "recorded by": a.event or "found in the run directory",
            "open with": a.command,
        }
        for a in items
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", key="timeline_files")
    missing = [str(a.path) for a in items if a.bytes is None]
    if missing:
        st.warning("Recorded but no longer on disk: " + ", ".join(missing))


st.title("Timeline")
run = state.pick_run("Run", state.list_runs(), key="timeline_run")
if run is not None:
    store = state.store()
    link = timeline.wandb_link(store.read_run_json(run))
    if link is not None:
        st.markdown(link)
    spans = timeline.phase_spans(store.frame(run))
    st.subheader("Phases of each step")
    if spans.empty:
        st.info(f"{run} has no perf records with a time yet: nothing to place on a timeline.")
    else:
        _chart(spans)
        st.caption(
            "Widths are each step's perf/<phase>_time (seconds); a step ends at its perf record's time and "
            "lasts perf/step_time. Phases are laid end to end in the loop's order; `other` is step time no "
            "phase covers; eval runs just before its step."
        )
        st.dataframe(_totals(spans), hide_index=True, key="timeline_totals")
    st.subheader("Profiler traces and memory snapshots")
    folders = timeline.artifact_folders(store.read_run_json(run))
    items = timeline.artifacts(store.run_path(run), store.read_events(run), folders)
    if items:
        _files(items)
    else:
        st.info(
            "None recorded: run with --use-pytorch-profiler (traces) or --record-memory-history (snapshots)."
        )
