"""Shared Streamlit glue for the pages: the RunStore (cached resource), RUNS_ROOTs, run pickers.

RUNS_ROOTs come from the script arguments (`streamlit run ui/app.py -- ROOT ...`, which is what
`grpolab ui` runs), else from `GRPOLAB_UI_ROOTS` (os.pathsep-separated; tests use it), else
`runs`. The run selection made on the Runs page lives in `st.session_state["selected_runs"]`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import streamlit as st

from grpolab.ui.runstore import RunInfo, RunStore

APP = Path(__file__).resolve().parent / "app.py"
SELECTED = "selected_runs"
STATUS_COLORS = {"ok": "#d4edda", "watch": "#fff3cd", "red": "#f8d7da", "n/a": "#eeeeee"}
"""Cell backgrounds of the health statuses (plain text, so no emoji font is needed)."""


def runs_roots() -> tuple[str, ...]:
    """The RUNS_ROOTs this app serves (see module docstring)."""
    argv = sys.argv
    if argv and Path(argv[0]).resolve() == APP and len(argv) > 1:
        return tuple(argv[1:])
    env = os.environ.get("GRPOLAB_UI_ROOTS")
    if env:
        return tuple(p for p in env.split(os.pathsep) if p)
    return ("runs",)


@st.cache_resource(max_entries=4)
def _store(roots: tuple[str, ...]) -> RunStore:
    return RunStore(roots)


def store() -> RunStore:
    """The process-wide RunStore for the current roots (its own caches follow file changes)."""
    return _store(runs_roots())


def list_runs() -> list[RunInfo]:
    """All runs; problems with the roots are shown as errors (never a traceback)."""
    s = store()
    runs = s.list_runs()
    for problem in s.problems:
        st.error(problem)
    if not runs:
        roots = ", ".join(map(str, s.roots))
        st.warning(
            f"No runs found under {roots}. A run is a folder written by `grpolab train --run-dir DIR`; "
            "Miles/slime console logs (*.log) are read too."
        )
    return runs


def selected(runs: list[RunInfo], *, at_least: int = 0) -> list[str]:
    """The run selection (Runs page), restricted to runs that exist; filled up to `at_least`."""
    ids = [r.run_id for r in runs]
    chosen = [r for r in st.session_state.get(SELECTED, []) if r in ids]
    for r in sorted(runs, key=lambda r: r.steps == 0):  # fill with runs that logged something first
        if len(chosen) >= at_least:
            break
        if r.run_id not in chosen:
            chosen.append(r.run_id)
    return chosen


def pick_runs(label: str, runs: list[RunInfo], key: str, *, at_least: int = 0) -> list[str]:
    """A multiselect seeded from the shared selection; the choice becomes the shared selection."""
    ids = [r.run_id for r in runs]
    if key not in st.session_state:
        st.session_state[key] = selected(runs, at_least=at_least)
    else:
        st.session_state[key] = [r for r in st.session_state[key] if r in ids]
    chosen = st.multiselect(label, ids, key=key)
    st.session_state[SELECTED] = list(chosen)
    return list(chosen)


def pick_run(label: str, runs: list[RunInfo], key: str) -> str | None:
    """One run (default: the first of the shared selection)."""
    ids = [r.run_id for r in runs]
    if not ids:
        return None
    if st.session_state.get(key) not in ids:
        first = selected(runs, at_least=1)
        st.session_state[key] = first[0] if first else ids[0]
    return st.selectbox(label, ids, key=key)


def fmt_time(t: float | None) -> str:
    """Unix seconds → 'YYYY-mm-dd HH:MM:SS' UTC ('' when unknown)."""
    return "" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
