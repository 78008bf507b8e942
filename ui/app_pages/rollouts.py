"""Rollouts: a recorded rollout's prompts and answers, and the per-token engine vs trainer gap.

The trainer side comes from `grpolab replay logprobs RUN_DIR --rollout N` (its result file, read
through the RunStore); the page can start that command as a subprocess and shows its progress.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from grpolab.core.turns.episode import episode_of
from grpolab.replay.format import RecordingError
from grpolab.replay.logprobs import LogprobsError, LogprobsResult
from grpolab.ui import jobs, state, turns_view

# Seconds between two looks at a running `grpolab replay logprobs` (the command takes seconds). A comment,
# not a docstring: Streamlit's "magic" would print a bare string of a page module on the page.
POLL_S = 1.0
if TYPE_CHECKING:
    from grpolab.core.batch import Sample

REDUCTIONS = {"sample_mean": "sample mean of token means", "token_mean": "token mean"}


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


def _turns_section(run: str, multi: list[Sample]) -> None:
    """A multi-turn answer's tokens by source and mask, and its turns (ui/turns_view.py)."""
    st.subheader("Turns of a multi-turn answer")
    pick = st.selectbox("Answer", [s.sample_index for s in multi], key="rollouts_turns_answer")
    sample = next(s for s in multi if s.sample_index == pick)
    texts = state.store().token_texts(run, sample.response_ids)
    frame = turns_view.token_frame(sample, texts)
    st.plotly_chart(
        turns_view.source_figure(frame, f"answer {pick}: each response token's source and loss mask"),
        key="rollouts_turns_strip",
    )
    st.dataframe(turns_view.turn_frame(sample), hide_index=True, width="stretch", key="rollouts_turns")
    st.caption(
        "Only the model's tokens train (loss mask 1); boundary, tool and user tokens are the chat template's "
        "(`grpolab check turns` on the recording checks them)."
    )


def _stale(result: LogprobsResult, samples: list[Sample]) -> bool:
    """Whether the result was computed from other engine log-probs than this recording's."""
    engine = {g.index: g.engine_log_probs for g in result.samples}
    return len(engine) != len(samples) or any(
        s.index not in engine or not np.array_equal(engine[s.index], s.rollout_log_probs.numpy())
        for s in samples
    )


def _read_result(run: str, rollout_id: int, samples: list[Sample]) -> tuple[LogprobsResult | None, bool]:
    """(the stored result when usable, whether a stored file exists that must be replaced with --force)."""
    try:
        result = store.read_logprobs(run, rollout_id)
    except (LogprobsError, OSError) as e:
        st.error(f"The stored trainer log-probs cannot be read: {e}")
        return None, True
    if result is not None and _stale(result, samples):
        st.warning(
            "The stored trainer log-probs were computed from another recording of this rollout "
            "(the engine log-probs differ); recompute them."
        )
        return None, True
    return result, False


def _gap_section(run: str, rollout_id: int, samples: list[Sample]) -> LogprobsResult | None:
    """The stored result, or the command's state: a button to start it, its progress, its failure."""
    result, replace = _read_result(run, rollout_id, samples)
    if result is not None:
        return result
    run_dir = store.run_path(run).resolve()
    key = ("replay logprobs", str(run_dir), rollout_id)
    job = jobs.get(key)
    if job is not None and job.state == "running":
        last = job.stderr_tail(1)
        st.info(f"Running `{job.command}` ({time.time() - job.started:.0f} s){': ' + last if last else ''}")
        time.sleep(POLL_S)
        st.rerun()
    if job is not None and job.state == "failed":
        st.error(f"`{job.command}` failed (exit {job.returncode}):")
        st.code(job.stderr_tail(), language=None)
    args = [
        "replay",
        "logprobs",
        str(run_dir),
        "--rollout",
        str(rollout_id),
        *(["--force"] if replace else []),
    ]
    st.caption(
        "Trainer log-probs are not stored in recordings. "
        f"`grpolab {' '.join(args)}` recomputes them on CPU with the weights the trainer held for this "
        f"rollout and writes them to the run directory (logprobs/rollout_{rollout_id}.json); the button runs it."
    )
    if st.button("Recompute trainer log-probs", key="rollouts_recompute"):
        try:
            jobs.start(key, args)
        except OSError as e:
            st.error(f"Cannot start `grpolab {' '.join(args)}`: {e}")
        else:
            st.rerun()
    return None


def _gap_line(result: LogprobsResult, step_records: list[dict[str, Any]]) -> str:
    """The recomputed gap of the rollout and of each step next to the values the run logged."""
    how = REDUCTIONS.get(result.reduction, result.reduction)
    line = f"Recomputed mean |gap| over the rollout ({how}): {result.mean_abs_gap:.6g}"
    if result.steps:
        line += ". Recomputed per step: " + ", ".join(f"step {k}: {v:.6g}" for k, v in result.steps)
    logged = [(r["step"], r["metrics"].get("train/train_rollout_logprob_abs_diff")) for r in step_records]
    values = ", ".join(f"step {step}: {v:.6g}" for step, v in logged if v is not None)
    if values:
        line += f". Logged train/train_rollout_logprob_abs_diff of this rollout: {values}"
    made = time.strftime("%Y-%m-%d %H:%M", time.localtime(result.created))
    return line + f". Weights: {result.weights.description}; computed {made}."


def _worst_tokens(
    samples: list[Sample], trainer: dict[int, np.ndarray] | None, texts: list[str] | None
) -> None:
    """The 20 tokens with the largest |trainer − engine| gap (lowest engine log-prob without the trainer
    side); `texts` decode the sorted distinct response token ids (None: no tokenizer here)."""
    ids = sorted({t for s in samples for t in s.response_ids})
    text_of = dict(zip(ids, texts)) if texts else {}
    rows = []
    for s in samples:
        lp = s.rollout_log_probs.numpy()
        tr = trainer.get(s.index) if trainer is not None else None
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
    if worst.empty:
        return
    by = "|gap|" if trainer is not None else "engine log-prob"
    worst = worst.sort_values(by, ascending=trainer is None).head(20)
    st.caption(
        "Ranked by |trainer − engine| gap."
        if trainer is not None
        else "Ranked by the lowest engine log-prob (recompute the trainer side to rank by the gap)."
    )
    st.dataframe(worst, hide_index=True, width="stretch", key="rollouts_worst")


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
        multi = [s for s in members if episode_of(s.metadata)]
        if multi:
            _turns_section(run, multi)
        labels = [f"answer {s.sample_index}" for s in members]
        engine = [s.rollout_log_probs.numpy() for s in members]
        st.plotly_chart(
            _strip(engine, labels, "Engine log-prob per token (from the recording)", "Viridis"),
            key="rollouts_engine_strip",
        )

        result = _gap_section(run, rollout_id, samples)
        trainer = None
        if result is not None:
            trainer = {g.index: g.trainer_log_probs for g in result.samples}
            gap = [np.abs(trainer[s.index] - s.rollout_log_probs.numpy()) for s in members]
            st.plotly_chart(
                _strip(gap, labels, "|trainer − engine| log-prob per token (recomputed)", "Reds"),
                key="rollouts_gap_strip",
            )
            st.write(_gap_line(result, store.step_records(run, rollout_id)))

        st.subheader("Worst tokens of the rollout")
        _worst_tokens(
            samples, trainer, store.token_texts(run, sorted({t for s in samples for t in s.response_ids}))
        )
