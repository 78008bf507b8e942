"""Bisect: start `grpolab bisect` as a background job, follow its progress lines, read past reports.

Reports are BISECT_DIR/<UTC time>/report.json (ui/bisect_reports.py reads them); the page starts the
command with `--output-dir BISECT_DIR`, so what it starts shows up in the list when it ends.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from grpolab.ui import bisect_reports, jobs, state
from grpolab.ui.bisect_reports import BisectRequest, StoredBisect

# Seconds between two looks at a running bisect (each tested commit takes seconds to minutes). A comment,
# not a docstring: Streamlit's "magic" would print a bare string of a page module on the page.
POLL_S = 1.0
OUTPUT_LINES = 40  # the newest output lines shown while it runs
ENDED_LINES = 400  # ... and once it ended: the progress lines, the answer and the diff report


def _request(folder: Path) -> BisectRequest:
    """The start form's values (widgets keyed bisect_*)."""
    c1, c2, c3 = st.columns(3)
    good = c1.text_input("--good (last good revision)", key="bisect_good")
    bad = c2.text_input("--bad (first known bad revision)", value="HEAD", key="bisect_bad")
    repo = c3.text_input("--repo (empty: the grpolab checkout)", key="bisect_repo")
    recording = st.text_input(
        "--recording TEMPLATE (rollout_{rollout_id}.grz files of a recorded run)", key="bisect_recording"
    )
    cmd = st.text_input(
        "--cmd 'TEMPLATE with {run_dir}' (instead of the train-only replay)", key="bisect_cmd"
    )
    c4, c5, c6, c7 = st.columns(4)
    num_rollout = c4.number_input(
        "--num-rollout (0: default)", min_value=0, value=0, key="bisect_num_rollout"
    )
    tol = c5.number_input("--tol (0 = bitwise)", min_value=0.0, value=0.0, format="%g", key="bisect_tol")
    timeout = c6.number_input("--timeout s (0: default)", min_value=0.0, value=0.0, key="bisect_timeout")
    metrics = c7.text_input("--metric KEY ... (space-separated)", key="bisect_metrics")
    flags = st.text_input("Train flags after --", key="bisect_flags")
    return BisectRequest(
        good=good,
        bad=bad,
        output_dir=folder,
        recording=recording,
        repo=repo,
        cmd=cmd,
        num_rollout=int(num_rollout) or None,
        metrics=tuple(metrics.split()),
        tol=float(tol),
        timeout_s=float(timeout) or None,
        train_flags=flags,
    )


def _job_section(folder: Path) -> None:
    """The job under this folder: its progress lines while it runs (polled), then how it ended, by
    `grpolab bisect`'s exit code (0 named the commit, 1 could not, 2 bad input), with its output."""
    job = jobs.get(("bisect", str(folder)))
    if job is None:
        return
    command = shlex.join(["grpolab", *job.args])  # as a user would type it (a template is quoted)
    if job.state == "running":
        st.info(f"Running `{command}` ({time.time() - job.started:.0f} s)")
        st.code(job.stderr_tail(OUTPUT_LINES) or "(no output yet)", language=None)
        time.sleep(POLL_S)
        st.rerun()
    code = job.returncode
    if code == 0:
        st.success(f"`{command}` named the first bad commit; its report is the newest below.")
    elif code == 1:
        st.warning(f"`{command}` ended without naming a first bad commit (exit 1); its report is below.")
    elif code == 2:
        st.error(f"`{command}` refused its input (exit 2):")
    elif code in (129, 130, 143):
        st.warning(f"`{command}` was interrupted (exit {code}); what it tested is in its report below.")
    else:
        st.error(f"`{command}` failed (exit {code}):")
    st.code(job.stderr_tail(ENDED_LINES), language=None)


TESTED_COLUMNS = [
    "short",
    "verdict",
    "seconds",
    "cached",
    "reason",
    "subject",
    "run",
    "first_step",
    "metrics",
]
"""report.json's tested-commit fields the table shows, in this order (diff/bisect.py `Tested.to_dict`)."""


def _show_diff(diff: dict) -> None:
    """What `grpolab diff` said about the first bad commit's run against the good one (RunDiff.to_dict)."""
    verdict = str(diff.get("verdict", "")).replace("_", " ")
    st.markdown(
        f"**grpolab diff** (good vs first bad): {verdict}; first divergent step {diff.get('first_step')}"
    )
    metrics = pd.DataFrame(diff.get("metrics") or [])
    if not metrics.empty:
        st.dataframe(metrics, hide_index=True, width="stretch")
    sample = diff.get("sample")
    if isinstance(sample, dict):
        st.caption(
            f"First differing sample: rollout {sample.get('rollout_id')}, prompt {sample.get('prompt_index')}, "
            f"sample {sample.get('sample_index')}, token {sample.get('token_index')} ({sample.get('field')})"
        )


def _show_report(found: StoredBisect) -> None:
    """One past report: git bisect's line with subject, date and diff stat, the tested commits (verdict,
    seconds, run directory), what diff said, and the notes."""
    st.subheader(found.folder.name)
    st.caption(f"Written {state.fmt_time(found.taken)} UTC · {found.folder / bisect_reports.REPORT}")
    if found.error is not None:
        st.warning(f"Unreadable bisect report: {found.error}")
        return
    report, first = found.report, found.first_bad
    if first is None:
        st.warning(f"This bisect named no first bad commit (exit {report.get('exit_code')}).")
    else:
        short = first.get("short") or str(first.get("commit", ""))[:7]
        st.error(f"`{short}` is the first bad commit")
        st.markdown(f"**{first.get('subject', '')}** · authored {first.get('author_date', '')}")
        if first.get("show"):
            with st.expander("Commit and diff stat"):
                st.code(str(first["show"]), language=None)
    tested = pd.DataFrame(found.tested)
    if not tested.empty:
        replays = report.get("replays")
        st.caption(
            f"{len(tested)} commits tested"
            + (f", {replays} replayed (the others from the cache)" if replays is not None else "")
        )
        shown = tested[[c for c in TESTED_COLUMNS if c in tested.columns]].copy()
        if "metrics" in shown.columns:  # the keys that differ: a list, or absent for the good end
            shown["metrics"] = [", ".join(m) if isinstance(m, list) else "" for m in shown["metrics"]]
        st.dataframe(shown, hide_index=True, width="stretch", key=f"bisect_tested_{found.folder.name}")
    if isinstance(report.get("diff"), dict):
        _show_diff(report["diff"])
    for note in report.get("notes") or []:
        st.warning(str(note))


st.title("Bisect")
default_dir = str(Path("bisect").resolve())
folder = Path(st.text_input("Bisect folder (--output-dir)", value=default_dir, key="bisect_dir")).expanduser()
with st.expander("Start a bisect", expanded=not bisect_reports.list_reports(folder)):
    request = _request(folder)
    if st.button("Start bisect", key="bisect_start"):
        try:
            args = bisect_reports.bisect_args(request)
            jobs.start(("bisect", str(folder)), args, with_stdout=True)
        except ValueError as e:
            st.error(str(e))
        except OSError as e:
            st.error(f"Cannot start `grpolab bisect`: {e}")
        else:
            st.rerun()
_job_section(folder)
reports = bisect_reports.list_reports(folder)
if not reports:
    st.info(
        f"No bisect reports under {folder} yet (`grpolab bisect` writes {folder}/<UTC time>/report.json)."
    )
for found in reports:
    _show_report(found)
