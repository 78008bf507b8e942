"""Health: the eight signals of manual 5.1 / the monitoring page for one run, and step-0 checks."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from pandas.io.formats.style import Styler
from plotly.subplots import make_subplots

from grpolab.checkers import step0
from grpolab.ui import health, state

PLOTTED = [
    "rollout/raw_reward",
    "train/kl_loss",
    "train/train_rollout_logprob_abs_diff",
    "train/entropy_loss",
    "train/grad_norm",
    "perf/rollout_time",
    "train/pg_clipfrac",
    "perf/train_time",
]


def _number(value: object) -> float | None:
    try:
        return None if value is None else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _settings(config: dict) -> tuple[float | None, int | None]:
    """clip_grad and groups per rollout from a run's config (ours) or launch flags (a Miles log)."""
    flags = config.get("flags") or {}
    clip = _number((config.get("optimizer") or {}).get("clip_grad", flags.get("clip-grad")))
    groups = _number((config.get("rollout") or {}).get("rollout_batch_size", flags.get("rollout-batch-size")))
    return clip, None if groups is None else int(groups)


def _counts(signals: list[health.Signal]) -> str:
    """The statuses counted, e.g. "1 red, 0 watch, 5 ok, 2 n/a"."""
    counts = pd.Series([s.status for s in signals]).value_counts()
    return ", ".join(f"{counts.get(k, 0)} {k}" for k in ("red", "watch", "ok", "n/a"))


def _table(signals: list[health.Signal]) -> Styler:
    """The signals as a table whose status cells are coloured."""
    table = pd.DataFrame(
        [
            {
                "signal": s.name,
                "status": s.status,
                "evidence": s.evidence,
                "metric": s.key,
                "rule": s.rule,
                "source": s.source,
            }
            for s in signals
        ]
    )
    return table.style.map(lambda v: f"background-color: {state.STATUS_COLORS.get(v, '')}", subset=["status"])


st.title("Health")
runs = state.list_runs()
run = state.pick_run("Run", runs, key="health_run")
if run is not None:
    store = state.store()
    frame = store.frame(run)
    clip, groups = _settings(store.read_config(run))
    done = store.completion(run)
    if done is not None and done.status == "running":  # not over yet: said, not an alarm
        st.info(f"Run status: {done.describe()}. `grpolab gate` fails a run until it finishes.")
    elif done is not None and not done.complete:  # the rule of `grpolab gate`'s status row
        st.error(f"Run status: {done.describe()}. `grpolab gate` fails this run (its status row).")
    elif done is not None:
        st.success(f"Run status: {done.describe()}.")
    if frame.empty:
        st.warning(f"{run} has no metric lines yet.")
    signals = health.health_signals(frame, clip_grad=clip, groups_per_rollout=groups)
    st.subheader("Eight signals")
    st.write(_counts(signals))
    st.dataframe(_table(signals), hide_index=True, width="stretch", key="health_signals")
    st.caption(
        f"clip_grad = {clip if clip is not None else '1.0 (Miles default; not in the run config)'}; "
        f"groups per rollout = {groups if groups is not None else 'unknown'}. Trends are means over "
        f"{health.WINDOW} steps (manual 5.1)."
    )

    st.subheader("Step-0 checks")
    st.caption("Step 0 is the run's first optimizer step (its first step record); the rules are those of "
               "`grpolab gate` and the in-run KL checker (checkers/step0.py).")  # fmt: skip
    others = [r.run_id for r in runs if r.run_id != run]
    baseline = st.multiselect("Baseline runs for the step-0 gap range", others, key="health_baseline")
    margin = st.number_input(
        "Gap margin (relative widening of the baseline range, as `grpolab gate --gap-margin`)",
        min_value=0.0,
        value=step0.DEFAULT_GAP_MARGIN,
        step=0.05,
        key="health_gap_margin",
    )
    firsts = [step0.first_step(store.records(b)) for b in baseline]
    gap_range = health.baseline_gap_range(firsts, float(margin)) if baseline else None
    if baseline and gap_range is None:
        st.warning("None of the baseline runs logged a step-0 gap.")
    first = step0.first_step(store.records(run))
    odd = {} if first is None else store.non_numeric(run).get(first.line_no, {})
    if first is not None and odd:
        st.warning(
            f"The first step record (line {first.line_no}) holds values that are not numbers: "
            + ", ".join(f"{k} = {v}" for k, v in odd.items())
        )
    checks = health.step0_checks(first, gap_range=gap_range, non_numeric=odd)
    st.write(_counts(checks))
    st.dataframe(_table(checks), hide_index=True, width="stretch")

    present = [k for k in PLOTTED if k in frame.columns and frame[k].notna().any()]
    if present:
        fig = make_subplots(rows=(len(present) + 1) // 2, cols=2, subplot_titles=present)
        for i, key in enumerate(present):
            s = health.series(frame, key)
            fig.add_trace(
                go.Scatter(x=s.index, y=s.values, mode="lines+markers", name=key),
                row=i // 2 + 1,
                col=i % 2 + 1,
            )
        fig.update_layout(height=220 * ((len(present) + 1) // 2), showlegend=False, margin={"t": 40})
        st.plotly_chart(fig, key="health_chart")
