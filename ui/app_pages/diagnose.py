"""Diagnose: hang reports and log doctor findings stored as JSON under RUN_DIR/diagnose/."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from grpolab.ui import analysis, state


def _is_table(value: object) -> bool:
    """A list of objects: shown as its own table."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


st.title("Diagnose")
runs = state.list_runs()
run = state.pick_run("Run", [r for r in runs if r.source == "grpolab"], key="diagnose_run")
if runs and run is None:
    st.info("Diagnose reports live in run directories; only console logs were found here.")
if run is not None:
    reports = state.store().read_diagnose(run)
    if not reports:
        st.info(
            f"No diagnose reports yet for {run} (looked for JSON files under "
            f"{state.store().run_path(run) / 'diagnose'}). Run `grpolab diagnose hang RUN_DIR` or "
            "`grpolab diagnose log FILE` to make one."
        )
    for rel, report in reports:
        with st.expander(rel, expanded=len(reports) == 1):
            flat = analysis.flatten({k: v for k, v in report.items() if not _is_table(v)})
            if flat:
                st.dataframe(
                    pd.DataFrame({"field": list(flat), "value": [str(v) for v in flat.values()]}),
                    hide_index=True,
                    width="stretch",
                )
            for key, value in report.items():
                if _is_table(value):
                    st.caption(key)
                    st.dataframe(pd.json_normalize(value).astype(str), hide_index=True, width="stretch")
