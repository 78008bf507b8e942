"""Rollouts: a recorded rollout's prompts and answers, and the per-token engine vs trainer gap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from grpolab.replay.format import RecordingError
from grpolab.ui import state


def _strip(values: list[np.ndarray], labels: list[str], title: str, colorscale: str) -> go.Figure:
    """One heatmap row per answer, one cell per response token."""
    width = max((len(v) for v in values), default=0)
    z = np.full((len(values), width), np.nan)
    for i, v in enumerate(values):
        z[i, : len(v)] = v
    fig = go.Figure(
        go.Heatmap(z=z, y=labels, colorscale=colorscale, hoverongaps=False, colorbar={"title": ""})
    )
    fig.update_layout(
        title=title, xaxis_title="response token", height=80 + 28 * len(values), margin={"t": 40}
    )
    return fig


st.title("Rollouts")
runs = state.list_runs()
store = state.store()
recorded = [r for r in runs if r.source == "grpolab" and store.list_rollouts(r.run_id)]
if runs and not recorded:
    st.info(
        "No run here has recorded rollouts. Record them with "
        "`grpolab train --save-debug-rollout-data RUN_DIR/rollouts/rollout_{rollout_id}.grz`."
    )
run = state.pick_run("Run", recorded, key="rollouts_run")
if run is not None:
    ids = list(store.list_rollouts(run))
    rollout_id = st.selectbox("Rollout", ids, key="rollouts_id")
    try:
        rec = store.read_rollout(run, rollout_id)
    except RecordingError as e:
        st.error(f"The recording of rollout {rollout_id} cannot be read: {e}")
        rec = None
    if rec is not None:
        samples = rec.samples
        groups = sorted({s.group_index for s in samples})
        st.caption(
            f"rollout {rec.rollout_id}, engine weight version {rec.weight_version}, {len(samples)} answers in "
            f"{len(groups)} groups; sampler {rec.sampler}"
        )
        group = st.selectbox("Group", groups, key="rollouts_group")
        members = [s for s in samples if s.group_index == group]
        st.text_area("Prompt", members[0].prompt_text if members else "", height=100, disabled=True)
        table = pd.DataFrame(
            [
                {
                    "answer": s.sample_index,
                    "reward": s.reward,
                    "advantage": s.advantage,
                    "finish": s.finish_reason,
                    "tokens": s.response_length,
                    "response": s.response_text,
                }
                for s in members
            ]
        )
        st.dataframe(table, hide_index=True, width="stretch", key="rollouts_answers")
        labels = [f"answer {s.sample_index}" for s in members]
        engine = [s.rollout_log_probs.numpy() for s in members]
        st.plotly_chart(
            _strip(engine, labels, "Engine log-prob per token (from the recording)", "Viridis"),
            key="rollouts_engine_strip",
        )

        cache_key = f"trainer_lp::{run}::{rollout_id}"
        weights = store.trainer_weights(run, rollout_id)
        if isinstance(weights, str):
            st.info(f"Trainer log-probs cannot be recomputed for this rollout: {weights}.")
        else:
            st.caption(
                f"Trainer log-probs are not stored in recordings. The button recomputes them on CPU with "
                f"the trainer's weights for this rollout: {weights.description}."
            )
            if st.button("Recompute trainer log-probs", key="rollouts_recompute"):
                with st.spinner("Loading the model and scoring the rollout…"):
                    try:
                        st.session_state[cache_key] = store.read_trainer_log_probs(run, rollout_id)
                    except (OSError, ValueError, RuntimeError, KeyError) as e:
                        st.error(f"Recomputing failed: {type(e).__name__}: {e}")
        trainer = st.session_state.get(cache_key)
        if trainer is not None:
            from grpolab.ui.logprob_gap import sample_mean_abs_gap

            gap = [np.abs(trainer[s.index] - s.rollout_log_probs.numpy()) for s in members]
            st.plotly_chart(
                _strip(gap, labels, "|trainer − engine| log-prob per token (recomputed)", "Reds"),
                key="rollouts_gap_strip",
            )
            recomputed = sample_mean_abs_gap(
                [s.rollout_log_probs.numpy() for s in samples],
                trainer,
                [s.loss_mask.numpy() for s in samples],
            )
            line = f"Recomputed mean |gap| over the rollout (sample mean of token means): {recomputed:.6g}"
            logged = [
                (r["step"], r["metrics"].get("train/train_rollout_logprob_abs_diff"))
                for r in store.step_records(run, rollout_id)
            ]
            if logged:
                values = ", ".join(f"step {step}: {v:.6g}" for step, v in logged if v is not None)
                line += f". Logged train/train_rollout_logprob_abs_diff of this rollout: {values}"
                line += " (the same quantity when the rollout is one optimizer step)."
            st.write(line)

        st.subheader("Worst tokens of the rollout")
        all_ids = [t for s in samples for t in s.response_ids]
        texts = store.token_texts(run, sorted(set(all_ids)))
        text_of = dict(zip(sorted(set(all_ids)), texts)) if texts else {}
        rows = []
        for s in samples:
            lp = s.rollout_log_probs.numpy()
            tr = trainer[s.index] if trainer is not None else None
            for t in range(len(lp)):
                rows.append(
                    {
                        "group": s.group_index,
                        "answer": s.sample_index,
                        "position": t,
                        "token id": s.response_ids[t],
                        "token": text_of.get(s.response_ids[t], ""),
                        "engine log-prob": float(lp[t]),
                        "trainer log-prob": None if tr is None else float(tr[t]),
                        "|gap|": None if tr is None else float(abs(tr[t] - lp[t])),
                    }
                )
        worst = pd.DataFrame(rows)
        if not worst.empty:
            by = "|gap|" if trainer is not None else "engine log-prob"
            worst = worst.sort_values(by, ascending=trainer is None).head(20)
            st.caption(
                "Ranked by |trainer − engine| gap."
                if trainer is not None
                else "Ranked by the lowest engine log-prob (recompute the trainer side to rank by the gap)."
            )
            st.dataframe(worst, hide_index=True, width="stretch", key="rollouts_worst")
