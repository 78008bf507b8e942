"""Sampling: a dynamic-sampling run's ledger, rollout by rollout (its `ledger` events, ui/ledger_view.py)."""

from __future__ import annotations

import streamlit as st

from grpolab.ui import ledger_view, state

st.title("Sampling")
runs = state.list_runs()
store = state.store()
ledgers = {r.run_id: store.read_events(r.run_id) for r in runs if r.source == "grpolab"}
with_ledger = [r for r in runs if any(e.get("event") == "ledger" for e in ledgers.get(r.run_id, []))]
if runs and not with_ledger:
    st.info(
        "No run here filtered its groups. Runs with `grpolab train --dynamic-sampling-filter-path ...` write "
        "a ledger per rollout: how many groups and tokens were generated, kept, filtered by reason and surplus."
    )
run = state.pick_run("Run", with_ledger, key="sampling_run")
if run is not None:
    events = ledgers[run]
    broken = sum(e.get("event") == "ledger" for e in events) - len(ledger_view.ledger_events(events))
    if broken:
        st.warning(f"{broken} ledger event(s) of this run lack fields and are left out.")
    frame = ledger_view.ledger_frame(events)
    st.plotly_chart(ledger_view.ledger_figure(frame), key="sampling_tokens")
    st.dataframe(ledger_view.ledger_summary(events), hide_index=True, width="stretch", key="sampling_summary")
    st.caption(
        "From the run's `ledger` events (events.jsonl). Surplus: groups the filter kept after the rollout "
        "was already full (generated in the same round, not trained). Never-trained prompts: rows drawn "
        "so far but never kept."
    )
    st.dataframe(frame, hide_index=True, width="stretch", key="sampling_fates")
