"""What the Rollouts page shows of a multi-turn answer: each response token's source, mask and weight
version, and one row per model turn (read from the sample's recorded episode, core/turns/episode.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from grpolab.core.turns.episode import episode_of, response_sources

if TYPE_CHECKING:
    from grpolab.core.batch import Sample

SOURCE_COLORS = {"model": "#2b7bba", "boundary": "#f0a202", "tool": "#3aa655", "user": "#9b59b6"}
"""Token colours by source; any other source (system, a custom function's "context") is grey."""
OTHER = "#9e9e9e"


def token_frame(sample: Sample, texts: list[str] | None) -> pd.DataFrame:
    """One row per response token: position, turn, source, trainable (loss mask), engine log-prob, the
    weight version of its model turn (None for other tokens) and its text (`texts` per response token,
    or the id when the tokenizer is not on disk)."""
    episode = episode_of(sample.metadata) or {}
    sources = response_sources(episode)
    versions = episode.get("weight_versions") or []
    mask, logp = sample.loss_mask.tolist(), sample.rollout_log_probs.tolist()
    rows = []
    for r, (source, turn) in enumerate(sources):
        rows.append({
            "position": r, "turn": turn, "source": source, "trainable": bool(mask[r] > 0),
            "log_prob": logp[r] if source == "model" else None,
            "weight_version": versions[turn - 1] if source == "model" and 0 < turn <= len(versions) else None,
            "token": texts[r] if texts else str(sample.response_ids[r]),
        })  # fmt: skip
    return pd.DataFrame(rows)


def turn_frame(sample: Sample) -> pd.DataFrame:
    """One row per model turn: its tokens, trainable tokens, weight version, finish and tool calls."""
    episode = episode_of(sample.metadata) or {}
    tokens = token_frame(sample, None)
    calls = episode.get("tool_calls") or []
    rows = []
    for k, n in enumerate(episode.get("reply_lengths") or [], start=1):
        mine = tokens[(tokens["turn"] == k) & (tokens["source"] == "model")] if len(tokens) else tokens
        rows.append({
            "turn": k, "reply tokens": n, "trainable": int(mine["trainable"].sum()) if len(mine) else 0,
            "context tokens after": int(((tokens["turn"] == k) & (tokens["source"] != "model")).sum()) if len(tokens) else 0,
            "weight version": (episode.get("weight_versions") or [None] * k)[k - 1],
            "finish": (episode.get("finish_reasons") or [""] * k)[k - 1],
            "tool calls": ", ".join(f"{c['name']}({c['arguments']}) -> {c['result']}" for c in calls if c.get("turn") == k),
        })  # fmt: skip
    return pd.DataFrame(rows)


def source_figure(frame: pd.DataFrame, title: str) -> go.Figure:
    """The response as one strip of tokens coloured by source, a second strip the loss mask (hover: the
    token's text, turn, source, weight version and log-prob)."""
    fig = go.Figure()
    colors = [SOURCE_COLORS.get(s, OTHER) for s in frame["source"]]
    hover = [
        f"{r.position}: {r.token!r}<br>turn {r.turn}, {r.source}, trainable {r.trainable}"
        + (f"<br>weight version {r.weight_version}, log-prob {r.log_prob:.4f}" if r.source == "model" else "")
        for r in frame.itertuples()
    ]
    fig.add_bar(x=frame["position"], y=[1] * len(frame), base=[1] * len(frame), marker_color=colors,
                hovertext=hover, hoverinfo="text", name="source", showlegend=False)  # fmt: skip
    fig.add_bar(x=frame["position"], y=[0.6] * len(frame), base=[0.2] * len(frame), hoverinfo="skip",
                marker_color=["#222222" if t else "#ffffff" for t in frame["trainable"]], name="trainable",
                showlegend=False)  # fmt: skip
    for source, color in (*SOURCE_COLORS.items(), ("other", OTHER)):
        fig.add_scatter(
            x=[None], y=[None], mode="markers", marker={"color": color, "symbol": "square"}, name=source
        )
    fig.update_layout(
        title=title, barmode="overlay", bargap=0, height=220, margin={"t": 40},
        yaxis={"tickvals": [0.5, 1.5], "ticktext": ["trainable", "source"], "range": [0, 2.1]},
        xaxis_title="response token",
    )  # fmt: skip
    return fig
