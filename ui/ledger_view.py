"""The Sampling page's data: a run's `ledger` events (rollout/ledger.py) as a frame and a stacked bar of
where each rollout's generated tokens went (kept, filtered by reason, surplus). Pure: events in, frames
and figures out; every number is a field of an events.jsonl `ledger` record."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

FATE_COLORS = {"kept": "#2ca02c", "surplus": "#7f7f7f"}
"""Bar colours of the two fixed fates; each filter reason gets the next of plotly's reds/oranges."""
LEDGER_FIELDS = (
    "rollout_id",
    "rounds",
    "generated",
    "kept",
    "surplus",
    "filtered",
    "epoch",
    "never_trained_count",
)
"""What a `ledger` event holds (rollout/ledger.py `record`); an event without them is left out, counted."""
REASON_COLORS = ("#d62728", "#ff7f0e", "#e377c2", "#bcbd22", "#8c564b", "#9467bd")


def ledger_frame(events: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (rollout, fate): columns rollout, fate ("kept", "filtered: <reason>", "surplus"),
    groups, samples, tokens (response tokens). Empty when the run has no `ledger` events."""
    rows = []
    for e in ledger_events(events):
        rid = int(e["rollout_id"])
        fates = [("kept", e["kept"]), *((f"filtered: {r}", t) for r, t in e["filtered"].items()),
                 ("surplus", e["surplus"])]  # fmt: skip
        rows += [{"rollout": rid, "fate": fate, **{k: int(t[k]) for k in ("groups", "samples", "tokens")}}
                 for fate, t in fates]  # fmt: skip
    return pd.DataFrame(rows, columns=["rollout", "fate", "groups", "samples", "tokens"])


def ledger_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The well-formed `ledger` events (every field of LEDGER_FIELDS present)."""
    return [e for e in events if e.get("event") == "ledger" and all(k in e for k in LEDGER_FIELDS)]


def ledger_summary(events: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per rollout: rounds, generated and kept groups and tokens, generated per kept token, the
    prompt stream's epoch and the prompts drawn but never trained so far."""
    rows = [
        {
            "rollout": int(e["rollout_id"]),
            "rounds": e["rounds"],
            "generated groups": e["generated"]["groups"],
            "kept groups": e["kept"]["groups"],
            "generated tokens": e["generated"]["tokens"],
            "kept tokens": e["kept"]["tokens"],
            "generated per kept token": e["generated"]["tokens"] / e["kept"]["tokens"]
            if e["kept"]["tokens"]
            else None,
            "epoch": e["epoch"],
            "never-trained prompts": e["never_trained_count"],
        }
        for e in ledger_events(events)
    ]
    return pd.DataFrame(rows)


def ledger_figure(frame: pd.DataFrame) -> go.Figure:
    """Stacked bars: per rollout, its generated tokens by fate."""
    fig = go.Figure()
    reasons = sorted(f for f in frame["fate"].unique() if f.startswith("filtered: "))
    colors = {**FATE_COLORS, **{r: REASON_COLORS[i % len(REASON_COLORS)] for i, r in enumerate(reasons)}}
    for fate in ["kept", *reasons, "surplus"]:
        part = frame[frame["fate"] == fate]
        if part.empty:
            continue
        fig.add_bar(x=part["rollout"], y=part["tokens"], name=fate, marker_color=colors[fate],
                    customdata=part["groups"], hovertemplate="%{y} tokens in %{customdata} groups")  # fmt: skip
    fig.update_layout(barmode="stack", title="Where each rollout's generated tokens went", xaxis_title="rollout",
                      yaxis_title="response tokens", margin={"t": 40})  # fmt: skip
    return fig
