"""Log-doctor rules for grpolab's own announcements: a CI fault injected on purpose, and a rollout engine
that failed for longer than `--engine-failure-timeout`.

Every `--ci-ft-test-actions` fault announces itself with `[grpolab fault] injecting …` first
(checkers/faults.py). The engine client's error (core/engine/client.py) reads `rollout engine '<name>'
failed for S s (--engine-failure-timeout T) …` and is followed by `last engine log lines:` and the
engine's last lines, indented by two spaces; they are read from the lines after it (context). How a
failed run ends (its error line, every rank's recorded error) is logdoctor/rules/run_failure.py's.

An engine whose process exited is not a timeout: the client's `rollout engine '<name>' is gone: engine 0
(URL) exited (killed by SIGKILL)` line, or a give-up line whose error names a fleet process that exited
(`engine 0 (URL) exited (...)`, what grpolab printed before the is-gone line), is collected here with its
quoted engine lines and judged by logdoctor/rules/engine_gone.py (`engine_gone`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from grpolab.diagnose.logdoctor.model import (
    MANUAL_WATCHDOG,
    MAX_EVIDENCE,
    Evidence,
    Finding,
    Line,
    Rule,
    clean_line,
    keep_line,
    register,
    trim_line,
)

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.ruleset import LogRules

FAULT_FLAG = "--ci-ft-test-actions"
"""The `grpolab train` flag that injects a CI fault (checkers/faults.py)."""
ENGINE_TAIL_LINES = 10
"""The engine log lines grpolab's engine error quotes (`LOG_TAIL_LINES` of core/engine/client.py)."""
ENGINE_TAIL_EVIDENCE = MAX_EVIDENCE - 2
"""Engine log lines shown as evidence (the last ones), beside the first failure and the error line."""
QUOTED_ENGINE_LOG = "quoted engine log"
"""The note of the engine log lines that the trainer's error quotes (logdoctor/story.py replaces them with
the engine log's own lines when it was read)."""
ENGINE_GIVE_UP = re.compile(
    r"rollout engine '(?P<engine>.*?)' failed for (?P<failed>[\d.]+) s "
    r"\(--engine-failure-timeout (?P<timeout>[^)]+)\)(?:.*?; last error: (?P<last>.*))?"
)
"""The engine client's give-up error (core/engine/client.py): engine name, seconds failed, timeout, last
error."""
ENGINE_IS_GONE = re.compile(r"rollout engine '(?P<engine>.*?)' is gone: (?P<reason>.*)")
"""The engine client's error for an engine that cannot come back (core/engine/client.py): name, reason."""
PROCESS_EXITED = re.compile(
    r"(?P<process>engine (?P<index>\d+)|router) \((?P<url>[^()\s]*)\) exited \((?P<how>[^)]*)\)"
)
"""A fleet process that exited, as grpolab names it (core/engine/fleet.py `describe_exit`): `engine 0
(http://127.0.0.1:P) exited (killed by SIGKILL)` or `router (...) exited (code 1)`."""
ENGINE_HUNG = re.compile(
    r"(?P<process>engine (?P<index>\d+)) \((?P<url>[^()\s]*)\) has not answered (?P<call>.+?) for "
    r"(?P<silent>[\d.]+) s"
)
"""An engine the client gave up on because it stopped answering (core/engine/liveness.py): `engine 0
(http://127.0.0.1:P) has not answered GET /health for 60.2 s (hung: ...)`."""


def is_engine_error(text: str) -> bool:
    """Whether `text` is the engine client's give-up or is-gone error (not a plain `train_failed` line)."""
    return ENGINE_GIVE_UP.search(text) is not None or ENGINE_IS_GONE.search(text) is not None


_FAULT = re.compile(r"injecting (?P<action>\w+) on rank (?P<rank>\d+) at rollout (?P<rollout>\d+)")


@register
class FaultInjected(Rule):
    """A `--ci-ft-test-actions` fault announced itself: info, so that nobody chases the failure it causes."""

    id = "fault_injected"
    severity = "info"
    needles = (b"[grpolab fault] injecting ",)
    cause = (
        f"The run was started with {FAULT_FLAG}, which makes one rank fail on purpose (exit, raise, hang "
        "or stop the rollout engine) to test how grpolab and its tools handle it. The failure after this "
        "line is that test, not a bug."
    )
    fix = f"Nothing to fix when the fault was meant; for a normal run leave out {FAULT_FLAG}."
    source = f"grpolab {FAULT_FLAG} (after Miles' ft_test_actions)"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.lines: list[tuple[Line, dict[str, Any]]] = []
        """Each announcement line and its action, rank and rollout (a line seen twice counts once)."""

    def observe(self, line: Line) -> None:
        m = _FAULT.search(line.text)
        if m:
            fault = {"action": m["action"], "rank": int(m["rank"]), "rollout": int(m["rollout"])}
            self.lines.append((line, fault))

    def before(self, line_no: int, action: str | None = None) -> tuple[Line, str] | None:
        """The last announcement (of `action`, if given) before line `line_no` and its action, or None."""
        found = [
            (ln, f["action"]) for ln, f in self.lines if ln.line < line_no and action in (None, f["action"])
        ]
        return found[-1] if found else None

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.lines:
            return []
        faults = list({tuple(f.values()): f for _, f in self.lines}.values())
        names = ", ".join(f"{f['action']} on rank {f['rank']} at rollout {f['rollout']}" for f in faults)
        many = f"{len(faults)} CI faults" if len(faults) > 1 else "a CI fault"
        return [
            self.finding(
                f"{many} injected on purpose ({FAULT_FLAG}): {names}",
                (self.ev(ln) for ln, _ in self.lines[:MAX_EVIDENCE]),
                {"faults": faults, "lines": len(self.lines)},
            )
        ]


def injected_note(fault: tuple[Line, str] | None) -> str:
    """The sentence a finding's cause ends with when its failure is an injected CI fault: `fault` is the
    announcement line and its action (`FaultInjected.before`); "" when None."""
    if fault is None:
        return ""
    line, action = fault
    return (
        f" The CI fault {action} was injected at line {line.line} ({FAULT_FLAG}): this failure is the "
        "expected outcome of that test."
    )


@register
class EngineDeadTimeout(Rule):
    """grpolab's engine client gave up on a rollout engine after `--engine-failure-timeout` seconds."""

    id = "engine_dead_timeout"
    severity = "error"
    needles = (b"(--engine-failure-timeout ", b"(--engine-failure-timeout) for it to recover", b"' is gone: ")
    source = f"grpolab's engine client (--engine-failure-timeout); {MANUAL_WATCHDOG}"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.errors: list[tuple[Line, re.Match[str]]] = []
        """The give-up lines (the run's console.log line, and the command's stderr line if captured too)."""
        self.gone: list[tuple[Line, re.Match[str]]] = []
        """The lines saying that an engine's process exited (is-gone lines, and give-up lines naming an
        exited process) and their `ENGINE_IS_GONE` or `ENGINE_GIVE_UP` match: engine_gone's."""
        self.waiting: list[Line] = []
        """`… waiting up to T s (--engine-failure-timeout) for it to recover`: the first failure of each episode."""
        self.after: dict[int, str] = {}
        """Lines just after a give-up line (line number → text): `last engine log lines:` and the engine's."""

    def observe(self, line: Line) -> None:
        if "(--engine-failure-timeout) for it to recover" in line.text:
            keep_line(self.waiting, line)
            return
        m = ENGINE_IS_GONE.search(line.text) or ENGINE_GIVE_UP.search(line.text)
        if m is None:
            return
        gone = m.re is ENGINE_IS_GONE or PROCESS_EXITED.search(line.text) is not None
        (self.gone if gone else self.errors).append((line, m))
        self.log.ask_context(self.id, line)

    def on_context(self, line_no: int, text: str) -> None:
        if any(0 < line_no - ln.line <= ENGINE_TAIL_LINES + 1 for ln, _ in (*self.errors, *self.gone)):
            self.after[line_no] = clean_line(text)

    def first_failure(self, line_no: int) -> Line | None:
        """The last `waiting up to … for it to recover` line before line `line_no`, or None."""
        return next((w for w in reversed(self.waiting) if w.line < line_no), None)

    def engine_tail(self, error_line: int) -> list[Line]:
        """The engine's last log lines quoted under the give-up line `error_line` (oldest first)."""
        if self.after.get(error_line + 1, "").strip() != "last engine log lines:":
            return []
        out = []
        for n in range(error_line + 2, error_line + 2 + ENGINE_TAIL_LINES):
            text = self.after.get(n)
            if text is None or not text.startswith("  ") or text.strip() == "(the engine logged nothing)":
                break
            out.append(Line(n, text))
        return out

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        if not self.errors:
            return []
        line, m = self.errors[-1]
        engine, timeout, last = m["engine"], m["timeout"], m["last"] or "(not given)"
        first = self.first_failure(line.line)
        tail = self.engine_tail(line.line)
        fault = self.log.rule(FaultInjected).before(line.line, "stop_engine_at_end")
        if fault is None and any("fault injection" in t.text for t in tail):
            fault = self.log.rule(FaultInjected).before(line.line)
        evidence: list[Evidence] = []
        if first is not None:
            evidence.append(self.ev(first, "first failure"))
        evidence.append(self.ev(line, focus="failed for"))
        evidence += [self.ev(t, QUOTED_ENGINE_LOG) for t in tail[-ENGINE_TAIL_EVIDENCE:]]
        since = f" (the first failure is at line {first.line})" if first is not None else ""
        injected = injected_note(fault)
        fix = (
            f"Read the engine's last log lines (quoted under line {line.line}) and the lines above the first "
            f"failure{since} for why the engine stopped; fix that and start the run again. An engine that "
            f"needs longer than {timeout} s to recover needs a larger --engine-failure-timeout. Trainers "
            "without such a timeout (Miles, slime) keep a dead engine's run alive for hours: guard them with "
            "`grpolab watchdog LOG_OR_RUN_DIR`."
        )
        return [
            self.finding(
                f"the rollout engine {engine!r} failed for {m['failed']} s (--engine-failure-timeout "
                f"{timeout}): the run stopped" + (" (an injected CI fault)" if fault else ""),
                evidence,
                {
                    "engine": engine,
                    "failed_for_s": float(m["failed"]),
                    "timeout_s": timeout,
                    "last_error": last,
                    "engine_log": [t.text.strip() for t in tail],
                    "first_failure_line": None if first is None else first.line,
                    "injected": fault is not None,
                },
                cause=(
                    f"grpolab's engine client gave up on the rollout engine {engine!r} after {m['failed']} s "
                    f"of failed calls and health checks (--engine-failure-timeout {timeout}) and stopped the "
                    "run with status failed, instead of sending requests to a dead engine for hours (the "
                    f"Miles 101 manual's 503 pattern). Last error: {trim_line(last, width=400)}." + injected
                ),
                fix=f"Nothing to fix if the fault was meant ({FAULT_FLAG})." if fault else fix,
            )
        ]
