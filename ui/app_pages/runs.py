"""Runs: every run directory and console log under the RUNS_ROOTs; pick the runs to compare."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from grpolab.ui import state

st.title("Runs")
runs = state.list_runs()
if runs:
    text = st.text_input("Filter (name, status, model, source)", key="runs_filter").strip().lower()

    def _det(d: dict) -> str:
        return ", ".join(f"{k}={v}" for k, v in d.items() if v is not None)

    rows = [
        {
            "run": r.run_id,
            "source": r.source,
            "status": r.status,
            "steps": r.steps,
            "last reward": r.last_reward,
            "model": r.model or "",
            "seed": r.seed,
            "start (UTC)": state.fmt_time(r.start_time),
            "determinism": _det(r.deterministic),
            "warnings": "; ".join(r.warnings),
        }
        for r in runs
    ]
    table = pd.DataFrame(rows)
    if text:
        hay = table[["run", "source", "status", "model"]].astype(str).agg(" ".join, axis=1).str.lower()
        table = table[hay.str.contains(text, regex=False)]
    st.dataframe(table, hide_index=True, width="stretch")
    st.caption(
        "status: finished / failed / interrupted from the run's final status event; running = no status "
        "event and a rank heartbeat younger than 5 min; crashed = neither; incomplete = no readable run.json. "
        "A console log has no status event: running = it grew in the last 5 min, else ended. "
        "last reward = the last logged rollout/raw_reward."
    )
    for r in runs:
        for w in r.warnings:
            st.warning(f"{r.run_id}: {w}")
    keep = set(table["run"]) | set(st.session_state.get(state.SELECTED, []))
    state.pick_runs("Runs to compare", [r for r in runs if r.run_id in keep], key="runs_pick")
    st.page_link("app_pages/compare.py", label="Compare the selected runs →")
