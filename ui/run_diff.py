"""The Compare page's drill-down: `grpolab diff`'s report (`grpolab.diff.diff_runs`, the same code as the
CLI) for two runs, shown step → sample → token → layer.

`compute` runs diff_runs on the runs' paths and keeps the answer until a run's metrics file changes;
`show` draws a RunDiff with Streamlit. The frames and the token highlight are plain functions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import streamlit as st

from grpolab.diff import diff_runs
from grpolab.diff.report import RunDiff, SampleDivergence
from grpolab.replay.format import RecordingError
from grpolab.ui import readers

VERDICT_BOX = {"identical": st.success, "differs": st.error, "cannot_judge": st.warning}
HASH_FLAG = "--save-model-hash-every-step"
"""The `grpolab train` flag that writes checks/model_hash_step_<N>.json, which the layer section needs."""


def _metrics_file(path: Path) -> Path:
    """The file a run's metrics grow in: RUN_DIR/metrics.jsonl, or the log file itself."""
    return path / "metrics.jsonl" if path.is_dir() else path


@st.cache_data(max_entries=16, show_spinner=False)
def _diff(paths: tuple[str, ...], tol: float, signatures: tuple[object, ...]) -> RunDiff | str:
    """diff_runs or its error; `signatures` only keys the cache."""
    try:
        return diff_runs(paths[0], paths[1], tol=tol, baselines=paths[2:])
    except (ValueError, OSError, RecordingError) as e:
        return str(e)


def compute(run_a: Path, run_b: Path, tol: float, baselines: Sequence[Path] = ()) -> RunDiff | str:
    """`diff_runs(run_a, run_b, tol=tol, baselines=baselines)`, or the error message when it cannot
    read a run (`DiffInputError`, a ValueError naming the path; an unreadable recording; an OSError).

    The answer is cached per (paths, tol) until the (size, mtime) of a run's metrics file changes: a
    running run appends metrics with each step, and records its rollouts as it logs them.
    """
    paths = (run_a, run_b, *baselines)
    signatures = tuple(readers.file_signature(_metrics_file(p)) for p in paths)
    return _diff(tuple(str(p) for p in paths), float(tol), signatures)


def _value(v: object) -> str:
    """A set-up value as a table cell: strings as they are, "—" for absent, else repr."""
    return "—" if v is None else v if isinstance(v, str) else repr(v)


def setup_frame(diff: RunDiff) -> pd.DataFrame:
    """One row per set-up difference: section (flags | env | data), key, run A's and run B's value
    (repr; "—" where the run does not record it)."""
    rows = [
        {"section": d.section, "key": d.key, "run A": _value(d.a), "run B": _value(d.b)} for d in diff.setup
    ]
    return pd.DataFrame(rows, columns=["section", "key", "run A", "run B"])


def metrics_frame(diff: RunDiff) -> pd.DataFrame:
    """One row per metric that differs: its first divergent step, both values, |Δ|, and the baseline band
    (NaN without `--baseline` runs); sorted by step then key, as RunDiff keeps them."""
    rows = [
        {
            "key": m.key,
            "step": m.step,
            "run A": m.a,
            "run B": m.b,
            "|Δ|": abs(m.a - m.b),
            "band low": m.band[0] if m.band else float("nan"),
            "band high": m.band[1] if m.band else float("nan"),
        }
        for m in diff.metrics
    ]
    return pd.DataFrame(rows, columns=["key", "step", "run A", "run B", "|Δ|", "band low", "band high"])


def _md(text: str) -> str:
    """Plain text made safe for Markdown on one line (backslash before the characters Markdown would
    read; a line break shown as ↵, so a text's newline cannot start a list or a heading)."""
    return re.sub(r"([\\`*_\[\]<>|~$#:+-])", r"\\\1", text).replace("\r", "").replace("\n", "↵")


def highlighted(text: str) -> str:
    """Markdown of a text around a token as diff/samples.py writes it (`before«token»after`): the token
    on an orange background, the rest escaped. A text without the «» marks is escaped whole."""
    start, end = text.find("«"), text.rfind("»")
    if start < 0 or end < start:
        return _md(text)
    token = text[start + 1 : end] or " "
    return f"{_md(text[:start])}:orange-background[{_md(token)}]{_md(text[end + 1 :])}"


def _show_sample(s: SampleDivergence, names: tuple[str, str]) -> None:
    """Sample and token: where, what differs, and both texts around the token."""
    where = f"rollout {s.rollout_id}, prompt {s.prompt_index}, sample {s.sample_index}"
    if s.token_index is None:
        st.markdown(f"**Sample**: {where}: the {s.field} differs")
    else:
        st.markdown(f"**Sample**: {where} · **token {s.token_index}** ({s.field} differ first)")
        tokens = pd.DataFrame(
            {
                "run": list(names),
                "token id": [s.token_a, s.token_b],
                "engine log-prob": [s.logprob_a, s.logprob_b],
            }
        )
        st.dataframe(tokens, hide_index=True, key="compare_drill_tokens")
    for name, text in zip(names, (s.text_a, s.text_b)):
        st.markdown(f"{_md(name)}: {highlighted(text)}")


def show(diff: RunDiff, names: tuple[str, str]) -> None:
    """Draw `diff` (run A and B shown as `names`): verdict, set-up table, first divergent step and the
    per-metric table, the first differing sample/token, the first differing layer, and every note as a
    warning (what could not be judged)."""
    tol = "bitwise" if diff.tol == 0 else f"tolerance {diff.tol:g}"
    VERDICT_BOX[diff.verdict](
        f"**{diff.verdict.replace('_', ' ').capitalize()}** ({tol}, {diff.common_steps} common steps)"
    )
    if diff.setup:
        st.caption("Set-up differences (resolved flags, environment fingerprint, data files):")
        st.dataframe(setup_frame(diff), hide_index=True, width="stretch", key="compare_drill_setup")
    else:
        st.caption("Same flags, environment and data files.")
    if diff.first_step is not None:
        st.metric("First divergent step (grpolab diff)", diff.first_step)
        st.dataframe(metrics_frame(diff), hide_index=True, width="stretch", key="compare_drill_metrics")
    if diff.sample is not None:
        _show_sample(diff.sample, names)
    if diff.layer is not None:
        lay = diff.layer
        st.markdown(f"**Layer**: after step {lay.step}, the first parameter that differs is `{lay.name}`")
        st.code(f"{names[0]}: {lay.hash_a}\n{names[1]}: {lay.hash_b}", language=None)
    elif diff.verdict == "differs" and not any("model hashes" in n for n in diff.notes):
        st.caption(f"No per-step model hashes in these runs (`grpolab train {HASH_FLAG}` writes them).")
    for note in diff.notes:
        st.warning(note)
