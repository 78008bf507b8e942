"""grpolab UI entry point: `streamlit run ui/app.py -- RUNS_ROOT ...` (or `grpolab ui RUNS_ROOT ...`).

Routes with `st.navigation` to the pages in `ui/app_pages/`; every page reads runs only through
the RunStore (`grpolab.ui.state.store()`), never files.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from grpolab.ui.state import runs_roots

PAGES = Path(__file__).resolve().parent / "app_pages"

st.set_page_config(page_title="grpolab", layout="wide")
st.session_state.setdefault("selected_runs", [])
navigation = st.navigation(
    [
        st.Page(PAGES / "runs.py", title="Runs", default=True),
        st.Page(PAGES / "compare.py", title="Compare"),
        st.Page(PAGES / "health.py", title="Health"),
        st.Page(PAGES / "timeline.py", title="Timeline"),
        st.Page(PAGES / "rollouts.py", title="Rollouts"),
        st.Page(PAGES / "sampling.py", title="Sampling"),
        st.Page(PAGES / "diagnose.py", title="Diagnose"),
        st.Page(PAGES / "bisect.py", title="Bisect"),
    ]
)
st.sidebar.caption("RUNS_ROOT: " + ", ".join(runs_roots()))
navigation.run()
