"""Log-doctor rule for a rollout engine whose process exited: `engine_gone`, told apart from a timeout.

grpolab's engine client stops a run at once when a process of the fleet it launched exited: it cannot
come back (core/engine/client.py `EngineGoneError`). The trainer's console then reads

    grpolab train: error: EngineDeadError: rollout engine '<name>' is gone: engine 0 (http://127.0.0.1:P)
        exited (killed by SIGKILL) ...

Runs made before that message existed said the same in a give-up line whose error names the exited
process: `... failed for 0.0 s (--engine-failure-timeout 60) ...; last error: resume_memory raised
EngineGoneError: engine 0 (http://127.0.0.1:P) exited (killed by SIGKILL)` (between rollouts), or
`... failed for 60.0 s ...; health: not ok (engine 0 (http://127.0.0.1:P) exited (killed by SIGKILL))`
(killed mid-rollout). Both are this rule's, not `engine_dead_timeout`'s: "failed for 0.0 s" is not a
timeout, and the cause to look for is why the process exited, not why it was slow. An engine that stopped
answering while requests ran is gone too (core/engine/liveness.py): `is gone: engine 0 (URL) has not
answered GET /health for 60.2 s (hung: ...)`.

EngineDeadTimeout (logdoctor/rules/announcements.py) collects these lines and the engine lines quoted
under them; this rule judges them. For a run directory, logdoctor/story.py adds the engine's own log
lines (engines/<i>.log) and the router's lines about its URL (router.log) to the finding.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpolab.diagnose.logdoctor.model import Evidence, Finding, Rule, register, trim_line
from grpolab.diagnose.logdoctor.rules.announcements import (
    ENGINE_HUNG,
    ENGINE_TAIL_EVIDENCE,
    FAULT_FLAG,
    PROCESS_EXITED,
    QUOTED_ENGINE_LOG,
    EngineDeadTimeout,
    FaultInjected,
    injected_note,
)

_SIGNAL = re.compile(r"killed by (?P<signal>SIG\w+)")
_NONE_LEFT = re.compile(r"--max-engine-restarts (?P<max>\d+): none left")
_RESTART_FAILED = re.compile(r"its restart failed: (?P<why>.+)")


def fault_tolerance(error: str) -> str | None:
    """What `--use-fault-tolerance` did, from the trainer's error line (core/engine/restart.py's words):
    "none left: --max-engine-restarts 3 used", "restart failed: <why>", or None (it was off)."""
    if m := _NONE_LEFT.search(error):
        return f"none left: --max-engine-restarts {m['max']} used"
    if m := _RESTART_FAILED.search(error):
        return f"restart failed: {m['why'].strip()}"
    return None


def exit_cause(how: str) -> str:
    """What an exit (`killed by SIGKILL`, `code 1`, as grpolab writes it) says about why the process ended."""
    m = _SIGNAL.search(how)
    if m and m["signal"] == "SIGKILL":
        return (
            "SIGKILL comes from outside the process: a `kill -9`, the host's OOM killer (out of host "
            "memory) or a container's memory limit; the engine cannot log it, so its log ends without an "
            "error."
        )
    if m:
        return (
            f"{m['signal']} ended it: a signal sent to it (or, for SIGSEGV/SIGABRT, a crash in native code)."
        )
    return f"It exited on its own ({how}): the last lines of its log say why (a Python traceback, out of memory)."


@dataclass(frozen=True)
class Gone:
    """What the trainer's error says went.

    Attributes:
        who: "engine 0", "router", or the client's engine name when the error names no process.
        index: the engine's index, or None.
        url: the process's URL, or None.
        state: "killed by SIGKILL", "code 1" (exited), "hung: no answer to GET /health for 60.2 s", or None.
        hung: the engine stopped answering (alive), rather than exited.
        failed_for: the seconds of a give-up line (`failed for S s`), None for an is-gone line.
    """

    who: str
    index: int | None
    url: str | None
    state: str | None
    hung: bool
    failed_for: float | None

    @classmethod
    def parse(cls, m: re.Match[str]) -> Gone:
        """From the `ENGINE_IS_GONE` or `ENGINE_GIVE_UP` match of the trainer's error line."""
        failed = float(m["failed"]) if "failed" in m.re.groupindex and m["failed"] else None
        if exited := PROCESS_EXITED.search(m.string):
            index = int(exited["index"]) if exited["index"] else None
            return cls(exited["process"], index, exited["url"], exited["how"], False, failed)
        if hung := ENGINE_HUNG.search(m.string):
            state = f"hung: no answer to {hung['call']} for {hung['silent']} s"
            return cls(hung["process"], int(hung["index"]), hung["url"], state, True, failed)
        return cls(f"the rollout engine {m['engine']!r}", None, None, None, False, failed)


@register
class EngineGone(Rule):
    """A process of the fleet grpolab launched (an engine or the router) exited or stopped answering, so
    the run stopped."""

    id = "engine_gone"
    severity = "error"
    source = (
        "grpolab's engine client and fleet (core/engine/client.py EngineGoneError, core/engine/fleet.py, "
        "core/engine/liveness.py)"
    )

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        timeout_rule = self.log.rule(EngineDeadTimeout)
        if not timeout_rule.gone:
            return []
        line, m = timeout_rule.gone[-1]  # the error line the run ended with
        gone = Gone.parse(m)
        first = timeout_rule.first_failure(line.line)
        tail = timeout_rule.engine_tail(line.line)
        fault = self.log.rule(FaultInjected).before(line.line, "stop_engine_at_end")
        evidence: list[Evidence] = [] if first is None else [self.ev(first, "first failure")]
        evidence.append(
            self.ev(line, "the trainer's error", focus="is gone" if "is gone" in line.text else None)
        )
        evidence += [self.ev(t, QUOTED_ENGINE_LOG) for t in tail[-ENGINE_TAIL_EVIDENCE:]]
        details: dict[str, Any] = {
            "engine": m["engine"],
            "process": gone.who if gone.index is not None or gone.who == "router" else None,
            "engine_index": gone.index,
            "url": gone.url,
            "state": gone.state,
            "hung": gone.hung,
            "failed_for_s": gone.failed_for,
            "error_line": trim_line(line.text, width=400),
            "engine_log": [t.text.strip() for t in tail],
            "first_failure_line": None if first is None else first.line,
            "injected": fault is not None,
            "fault_tolerance": fault_tolerance(line.text),
        }
        return [
            self.finding(
                _title(gone) + (" (an injected CI fault)" if fault else ""),
                evidence,
                details,
                cause=_cause(gone, details["fault_tolerance"]) + injected_note(fault),
                fix=f"Nothing to fix if the fault was meant ({FAULT_FLAG})."
                if fault
                else _fix(gone, details["fault_tolerance"]),
            )
        ]


def _title(gone: Gone) -> str:
    where = f" ({gone.url})" if gone.url else ""
    state = f" ({gone.state})" if gone.state else ""
    # not "at once": an exited engine fails the next call to it (seconds later between rollouts), a hung one
    # after --engine-failure-timeout without an answer (its state says how long)
    after = (
        f" after {gone.failed_for:.1f} s of failed calls"
        if gone.failed_for
        else ("" if gone.hung else " at the next call to it")
    )
    return f"{gone.who}{where} is gone{state}: the run stopped{after}"


def _cause(gone: Gone, ft: str | None = None) -> str:
    where = f" at {gone.url}" if gone.url else ""
    if ft is not None and ft.startswith("none left"):
        return (f"{gone.who}{where} went ({gone.state or 'gone'}) after --use-fault-tolerance had used every "
                f"restart the run allows ({ft.split(': ', 1)[1]}), so this one failed the run.")  # fmt: skip
    if ft is not None:
        return (f"{gone.who}{where} went ({gone.state or 'gone'}) and --use-fault-tolerance could not bring it "
                f"back: its {ft} (a restarted engine rejoins the router only once it starts, holds the "
                "trainer's weights and passes their check).")  # fmt: skip
    if gone.hung:
        text = (
            f"The process of {gone.who}{where} is alive but stopped answering ({gone.state}): stopped "
            "(SIGSTOP), deadlocked, or stuck in one long step. --engine-failure-timeout treats an engine that "
            "silent as dead, so the engine client stopped the run with status failed."
        )
        return text
    text = (
        f"The process of {gone.who}{where} exited while the run used it. grpolab launched it and watches it: "
        "a process that exited cannot come back, so the engine client stopped the run with status failed "
    )
    if gone.failed_for:
        text += (
            f"(after {gone.failed_for:.1f} s: the failed calls waited for the engine to recover before its "
            "exit was seen)."
        )
    else:
        text += "at once instead of waiting out --engine-failure-timeout."
    return text + (f" {exit_cause(gone.state)}" if gone.state else "")


def _fix(gone: Gone, ft: str | None = None) -> str:
    log = f"RUN_DIR/engines/{gone.index}.log" if gone.index is not None else "the engine's log"
    if ft is not None and ft.startswith("none left"):
        return (f"Read RUN_DIR/events.jsonl's engine_restart events and {log} for why the engines keep dying; "
                "raise --max-engine-restarts only if that many deaths are expected.")  # fmt: skip
    if ft is not None:
        return (f"Read the restart's reason above and the end of {log} (the restarted process's lines come "
                "last); a refused check names the weight version or tensor that differed.")  # fmt: skip
    if gone.who == "router":
        log = "RUN_DIR/router.log"
    if gone.hung:
        return (
            f"Read the last lines of {log} for what the engine was doing; the next time it hangs, dump its "
            "stacks (py-spy dump --pid PID) before the timeout ends the run. Then start the run again: grpolab "
            "launches fresh engines."
        )
    again = "Then start the run again: grpolab launches fresh engines" + (
        " (with --use-fault-tolerance it restarts an engine that exits, checked, instead of failing)."
        if gone.who != "router"
        else "."
    )
    if gone.state and "SIGKILL" in gone.state:
        return (
            f"Read the last lines of {log} (quoted in the run's error) for why the process ended; for a "
            "SIGKILL nobody sent, look for the OOM killer (`dmesg`, `journalctl -k`) and give the engines "
            f"more host memory or fewer engines per host. {again}"
        )
    return (
        f"Read the last lines of {log} (quoted in the run's error) for why the process ended: a Python "
        "traceback names the exception, a fatal Python error lists the crashed thread's frames (start the "
        f"run with PYTHONFAULTHANDLER=1 in the environment to get them; the engines inherit it). {again}"
    )
