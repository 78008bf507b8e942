"""Diagnose: the hang reports of `grpolab diagnose hang` and the log doctor's findings on the console log."""

from __future__ import annotations

import re

import pandas as pd
import streamlit as st

from grpolab.diagnose.logdoctor import Finding
from grpolab.ui import analysis, state
from grpolab.ui.runstore import StoredHangReport

SEVERITY_BOX = {"error": st.error, "warning": st.warning, "info": st.info}


def _md(text: object) -> str:
    """Plain text made safe for Markdown (stack frames hold `_`, `*`, `<module>`, `$`...); `code` stays code."""
    return re.sub(r"([\\*_\[\]<>|~$])", r"\\\1", str(text))


def _is_table(value: object) -> bool:
    """A list of objects: shown as its own table."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _show_dumps(hang: StoredHangReport) -> None:
    for rank, text in hang.dumps.items():
        with st.expander(f"rank {rank}: py-spy dump (rank{rank}.txt)"):
            st.code(text, language=None)


def show_hang_report(hang: StoredHangReport) -> None:
    """Verdict, evidence, ranks, next steps, notes and the py-spy dumps of one report; an unreadable
    verdict.json shows as unreadable (a warning naming the file), with no verdict."""
    if hang.error is not None:
        st.subheader(_md(f"{hang.folder}: unreadable hang report"))
        st.warning(f"No verdict: {_md(hang.error)}")
        st.caption(f"Taken {state.fmt_time(hang.taken)} UTC · {hang.folder}/")
        _show_dumps(hang)
        return
    report, verdict = hang.report, hang.report["verdict"]
    st.subheader(_md(verdict.get("title") or f"{hang.folder}/verdict.json: a verdict without a title"))
    hung = report["hung"]
    kind = str(verdict.get("kind", "unknown")).replace("_", " ") if hung else None
    pattern = f"AReaL pattern {verdict['pattern']}" if verdict.get("pattern") else kind
    reason = _md((report.get("progress") or {}).get("reason", ""))
    status = " · ".join(p for p in ("**Hung**" if hung else "**Not hung**", pattern, reason) if p)
    (st.error if hung else st.success)(status)
    elapsed = report.get("elapsed_s")
    st.caption(
        f"Taken {state.fmt_time(hang.taken)} UTC · {hang.folder}/"
        + (f" · the diagnosis took {elapsed:.1f} s" if isinstance(elapsed, int | float) else "")
    )
    if verdict.get("evidence"):
        st.markdown("**Evidence**\n\n" + "\n".join(f"- {_md(e)}" for e in verdict["evidence"]))
    rows = pd.DataFrame(verdict.get("rows") or [])
    if not rows.empty:
        columns = ["rank", "pid", "state", "heartbeat_age_s", "where"]
        if rows.get("thread", pd.Series(dtype=object)).nunique() > 1:
            columns.insert(3, "thread")
        st.dataframe(
            rows.reindex(columns=columns).rename(columns={"heartbeat_age_s": "heartbeat age (s)"}),
            hide_index=True,
            width="stretch",
            column_config={
                "rank": st.column_config.NumberColumn(width="small"),
                "pid": st.column_config.NumberColumn(width="small"),
                "heartbeat age (s)": st.column_config.NumberColumn(format="%.1f", width="small"),
                "where": st.column_config.TextColumn(width="large"),
            },
        )
    if verdict.get("next_steps"):
        steps = "\n".join(f"{i}. {_md(s)}" for i, s in enumerate(verdict["next_steps"], 1))
        st.markdown("**Next steps**\n\n" + steps)
    missing = [f"rank {r}: {why}" for r, why in (report.get("missing_ranks") or {}).items()]
    notes = [*(report.get("notes") or []), *missing, (report.get("progress") or {}).get("note")]
    if any(notes):
        st.markdown("**Notes**\n\n" + "\n".join(f"- {_md(n)}" for n in notes if n))
    _show_dumps(hang)


def show_other_report(rel: str, report: dict) -> None:
    """Any other JSON under diagnose/: its fields flattened, lists of objects as tables."""
    with st.expander(rel):
        flat = analysis.flatten({k: v for k, v in report.items() if not _is_table(v)})
        if flat:
            frame = pd.DataFrame({"field": list(flat), "value": [str(v) for v in flat.values()]})
            st.dataframe(frame, hide_index=True, width="stretch")
        for key, value in report.items():
            if _is_table(value):
                st.caption(key)
                st.dataframe(pd.json_normalize(value).astype(str), hide_index=True, width="stretch")


def show_finding(finding: Finding) -> None:
    """Severity, rule id and title; evidence lines with their numbers; cause, fix and source."""
    with st.container(border=True):
        SEVERITY_BOX.get(finding.severity, st.info)(
            f"**{finding.severity.upper()}** · `{finding.rule}` · {_md(finding.title)}"
        )
        width = max((len(str(e.line)) for e in finding.evidence), default=1)
        lines = [
            f"{e.line:>{width}}  {e.text}" + (f"  [{e.note}]" if e.note else "") for e in finding.evidence
        ]
        st.code("\n".join(lines), language=None, wrap_lines=True)
        st.markdown(f"**Cause:** {_md(finding.cause)}\n\n**Fix:** {_md(finding.fix)}")
        st.caption(f"Source: {_md(finding.source)}")


st.title("Diagnose")
runs = state.list_runs()
run = state.pick_run("Run", runs, key="diagnose_run")
if run is not None:
    store = state.store()
    source = next(r.source for r in runs if r.run_id == run)
    if source == "grpolab":
        st.header("Hang reports")
        hangs, others = store.read_hang_reports(run), store.read_diagnose(run)
        if not hangs and not others:
            st.info(
                f"No hang reports yet for {run} (looked under {store.run_path(run) / 'diagnose'}). "
                "While the run hangs, `grpolab diagnose hang RUN_DIR` makes one."
            )
        for hang in hangs:
            with st.container(border=True):
                show_hang_report(hang)
        for rel, report in others:
            show_other_report(rel, report)
    st.header("Log doctor")
    log = store.log_file(run)
    with st.spinner(f"Scanning {log.name}…"):
        scan = store.read_log_findings(run)
    if scan is None:
        st.info(f"No {log.name} in {log.parent}: grpolab writes one per run directory.")
    elif scan.error is not None:
        st.error(f"Cannot read {log}: {scan.error}")
    else:
        scanned = f"{scan.lines:,} lines" if scan.lines is not None else f"{scan.size / 1e6:.1f} MB"
        st.caption(f"`grpolab diagnose log {log}` · {scanned} scanned in {scan.seconds:.2f} s")
        if not scan.findings:
            st.success(f"No known failure signature in {log.name} ({scanned} scanned).")
        for finding in scan.findings:
            show_finding(finding)
