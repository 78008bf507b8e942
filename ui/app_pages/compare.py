"""Compare: metrics of 2+ runs on the same step numbers, a seed band, config and per-step diffs, and
`grpolab diff`'s report of two of them with its drill-down (ui/run_diff.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from grpolab.ui import analysis, run_diff, state

DEFAULT_KEYS = {
    "rollout/": ["rollout/raw_reward", "rollout/response_lengths"],
    "train/": ["train/loss", "train/train_rollout_logprob_abs_diff"],
    "perf/": ["perf/step_time", "perf/rollout_time"],
}

st.title("Compare")
runs = state.list_runs()
chosen = state.pick_runs("Runs", runs, key="compare_runs", at_least=2) if runs else []
if runs and len(chosen) < 2:
    st.info("Pick two or more runs to compare.")
if len(chosen) >= 2:
    store = state.store()
    all_keys = store.metric_keys(chosen)
    if not all_keys:
        st.warning("None of these runs logged a metric yet.")
    c1, c2 = st.columns([1, 3])
    namespace = c1.selectbox("Namespace", [*analysis.NAMESPACES, "other"], key="compare_ns")
    options = analysis.keys_in_namespace(all_keys, namespace)
    defaults = [k for k in DEFAULT_KEYS.get(namespace, []) if k in options] or options[:2]
    if st.session_state.get("compare_keys_ns") != namespace:
        st.session_state["compare_keys"] = defaults
        st.session_state["compare_keys_ns"] = namespace
    keys = c2.multiselect("Metrics", options, key="compare_keys")
    t1, t2, t3 = st.columns(3)
    same_only = t1.toggle("Same steps only", value=True, key="compare_same")
    clean_only = t2.toggle("Clean steps only (time metrics)", value=False, key="compare_clean")
    for widget in ("compare_baseline", "diff_a", "diff_b"):  # drop stale picks of runs no longer chosen
        value = st.session_state.get(widget)
        if isinstance(value, list):
            st.session_state[widget] = [r for r in value if r in chosen]
        elif value is not None and value not in chosen:
            del st.session_state[widget]
    baseline = t3.multiselect("Baseline group (seeds)", chosen, key="compare_baseline")
    st.caption(
        "x = the train step for train/* keys and the rollout id for the others (equal with one "
        "optimizer step per rollout). Same steps only keeps step numbers that every run logged, so "
        "times are compared on the same steps (manual 5.3)."
    )
    scalars = store.read_scalars(chosen, keys)
    clean: dict[str, pd.Series] = {}
    if clean_only:
        marked = False
        for r in chosen:
            marks = analysis.throttle_times(store.read_gpu(r))  # thermal/power throttles only, not gpu_idle
            clean[r] = analysis.clean_steps(store.frame(r), marks)
            marked = marked or len(marks) > 0
        if not marked:
            st.caption("No thermal or power throttle in these runs' gpu.jsonl: every step counts as clean.")
    shown: list[pd.DataFrame] = []
    for key in keys:
        series = analysis.metric_series(scalars, key)
        kind = analysis.key_kind(scalars, key)
        if clean_only and key.startswith("perf/"):
            for r, ok in clean.items():
                if r in series.columns and len(ok):
                    series.loc[~series.index.isin(ok[ok].index), r] = np.nan
        if same_only:
            series = analysis.same_steps(series)
        if series.empty:
            st.warning(f"{key}: no step number is common to all selected runs; nothing to draw.")
            continue
        band = analysis.seed_band(series, baseline)
        fig = go.Figure()
        if not band.empty:
            fig.add_trace(
                go.Scatter(x=band.index, y=band["max"], mode="lines", line={"width": 0}, showlegend=False)
            )
            fig.add_trace(
                go.Scatter(
                    x=band.index,
                    y=band["min"],
                    mode="lines",
                    line={"width": 0},
                    fill="tonexty",
                    fillcolor="rgba(120,120,120,0.25)",
                    name=f"baseline min–max ({len(baseline)} runs)",
                )
            )
        for r in series.columns:
            s = series[r].dropna()
            dash = "dot" if r in baseline else "solid"
            fig.add_trace(
                go.Scatter(x=s.index, y=s.values, mode="lines+markers", name=r, line={"dash": dash})
            )
        fig.update_layout(
            title=key, xaxis_title=analysis.axis_label(kind), height=320, margin={"t": 40, "b": 40}
        )
        if len(series.index) <= 20:
            fig.update_xaxes(dtick=1)  # step numbers are integers
        st.plotly_chart(fig, key=f"chart_{key}")
        verdicts = analysis.band_verdicts(series, baseline, chosen)
        if verdicts:
            st.dataframe(
                pd.DataFrame(
                    [
                        {
                            "run": v.run,
                            f"mean of last {v.last_n} steps": v.value,
                            "baseline low": v.low,
                            "baseline high": v.high,
                            "outside the seed spread": v.outside,
                        }
                        for v in verdicts
                    ]
                ),
                hide_index=True,
            )
        long = series.reset_index().melt(id_vars="step", var_name="run", value_name="value").dropna()
        long.insert(0, "key", key)
        shown.append(long)
    if shown:
        st.download_button(
            "Download shown values (CSV)",
            pd.concat(shown).to_csv(index=False),
            file_name="grpolab-compare.csv",
            mime="text/csv",
        )

    st.subheader("Config diff")
    diff = analysis.config_diff({r: store.read_config(r) for r in chosen})
    if diff.empty:
        st.write("The configs are identical.")
    else:
        st.caption("Only the keys whose values differ ('—': the run has no such key).")
        st.dataframe(diff, width="stretch")

    st.subheader("Per-step diff")
    d1, d2, d3, d4 = st.columns(4)
    run_a = d1.selectbox("Run A", chosen, index=0, key="diff_a")
    run_b = d2.selectbox("Run B", chosen, index=1, key="diff_b")
    tol = d3.number_input("Tolerance (0 = bitwise)", min_value=0.0, value=0.0, format="%g", key="diff_tol")
    with_perf = d4.toggle("Include perf/ (wall-clock)", value=False, key="diff_perf")
    diff_keys = [k for k in store.metric_keys([run_a, run_b]) if with_perf or not k.startswith("perf/")]
    report = analysis.divergence_report(
        store.read_scalars([run_a, run_b], diff_keys), run_a, run_b, diff_keys, tol
    )
    if report.common_steps == 0:
        st.warning(f"{run_a} and {run_b} have no common step numbers to compare.")
    elif report.first_step is None:
        n = report.common_steps  # not green: the verdict below (`grpolab diff`) alone is coloured
        st.write(f"No key differs over {n} common step{'' if n == 1 else 's'} (tolerance {tol:g}).")
    else:
        st.metric("First divergence step", report.first_step)
        st.caption(f"Keys that differ there: {', '.join(report.first_keys)}")
    if not report.table.empty:
        st.dataframe(report.table, width="stretch")
        st.download_button(
            "Download per-step diff (CSV)",
            report.table.to_csv(),
            file_name="grpolab-diff.csv",
            mime="text/csv",
        )

    st.subheader("Where they part (`grpolab diff`)")
    paths = {r: store.run_path(r) for r in chosen}
    others = [paths[r] for r in baseline if r not in (run_a, run_b)]
    command = f"grpolab diff {paths[run_a]} {paths[run_b]} --tol {tol:g}"
    st.caption(
        "The report of `grpolab diff` (same code): set-up, then step → sample → token → layer, as deep as "
        "both runs' files allow. Timing metrics are not compared. With a baseline group, run B differs "
        f"only outside the band of run A and the other baseline runs. `{command}"
        + "".join(f" --baseline {p}" for p in others)
        + "`"
    )
    if run_a == run_b:
        st.info("Pick two different runs as Run A and Run B.")
    else:
        found = run_diff.compute(paths[run_a], paths[run_b], tol, others)
        if isinstance(found, str):
            st.error(f"grpolab diff cannot compare these runs: {found}")
        else:
            run_diff.show(found, (run_a, run_b))
