"""The log doctor's dead-engine rule: "503 Service Unavailable" lines judged by the Miles 101 manual's
watchdog (§1.2: every 30 s count the last 60 s; stop after more than 100 in 10 checks in a row).

The 503 lines are too many for per-line work (200,533 in the manual's 147 MB log): the scanner counts
them per time bucket into `EngineErrors` (the `counted_needle` of `DeadEngine`) and hands over only the
first line, the lines above it and the text of the last one. `DeadEngine` reports errors that never
stop (and 503 lines without times, counted only); `Engine503Bursts` reports bursts the rule lets pass.
"""

from __future__ import annotations

import calendar
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpolab.diagnose.common.dead_engine import (
    DEFAULT_PATTERN,
    WatchdogReplay,
    WatchdogRule,
    count_in_window,
    replay_rule,
)
from grpolab.diagnose.common.wording import plural
from grpolab.diagnose.logdoctor.model import (
    MANUAL_TROUBLE,
    MANUAL_WATCHDOG,
    Evidence,
    Finding,
    Line,
    Rule,
    clean_line,
    register,
    trim_line,
)
from grpolab.diagnose.logdoctor.rules.engine import EngineOomStart

if TYPE_CHECKING:
    from grpolab.diagnose.logdoctor.ruleset import LogRules

DEAD_ENGINE_NEEDLE = DEFAULT_PATTERN.encode()

_STAMP = re.compile(rb"(\d{4}-\d\d-\d\d)[T ](\d\d):(\d\d):(\d\d)")


class EngineErrors:
    """The "503 Service Unavailable" lines of one log, counted per time bucket (Miles 101 manual §1.2).

    Times are whole seconds read from each line's first date-time (`time_in`). The
    watchdog is replayed from the first error: checks at start + k·interval count the errors of
    (t − window, t]. Buckets are gcd(interval, window) seconds wide and end on those check times,
    so counting per bucket gives every check's count exactly. The scanner finds bucket boundaries by
    bisecting the 503 lines of a chunk, which assumes they are in time order (one client writes them);
    a line out of order by less than a bucket can be counted in its neighbour, and a 503 line without
    a time (in a log whose first 503 has one) counts in the bucket of the lines around it.
    """

    def __init__(self, rule: WatchdogRule) -> None:
        self.rule = rule
        self.width = math.gcd(int(rule.interval), int(rule.window))
        self.start: int | None = None
        self.timed: bool | None = None
        self.counts: dict[int, int] = {}
        self.untimed = 0
        self.first: Line | None = None
        self.last: str | None = None
        self.above: list[Line] = []
        self.last_time: int | None = None
        self._days: dict[bytes, int] = {}

    @property
    def total(self) -> int:
        """Error lines counted (timed and untimed)."""
        return sum(self.counts.values()) + self.untimed

    def begin(self, data: bytes | bytearray, start: int = 0, end: int | None = None) -> bool:
        """Start from the first error line (data[start:end], its text before the needle); returns
        whether it has a time. Without one the rule counts only (the time rule cannot be applied)."""
        t = self.time_in(data, start, end)
        self.timed = t is not None
        self.start = t
        return self.timed

    def time_in(self, data: bytes | bytearray, start: int = 0, end: int | None = None) -> int | None:
        """Whole seconds (Unix, the time read as UTC) of the first date-time in data[start:end], or None.

        Reads `YYYY-MM-DD HH:MM:SS` or `YYYY-MM-DDTHH:MM:SS` (Miles, SGLang, ISO 8601), as
        `dead_engine.parse_time` does; a zone suffix is ignored, as only differences within one log
        count. Days are cached: a probe costs one regex search.
        """
        m = _STAMP.search(data, start, len(data) if end is None else end)
        if m is None:
            return None
        day = m.group(1)
        base = self._days.get(day)
        if base is None:
            base = self._days[day] = calendar.timegm(
                (int(day[:4]), int(day[5:7]), int(day[8:10]), 0, 0, 0, 0, 0, 0)
            )
        return base + int(m.group(2)) * 3600 + int(m.group(3)) * 60 + int(m.group(4))

    def bucket(self, t: int) -> int:
        """Index j of the bucket (start + (j−1)·width, start + j·width] holding time `t` (seconds)."""
        assert self.start is not None
        return -((self.start - t) // self.width)

    def bucket_end(self, j: int) -> int:
        """The last second of bucket j (a check time when it is a multiple of the interval)."""
        assert self.start is not None
        return self.start + j * self.width

    def add(self, j: int | None, count: int) -> None:
        """Add `count` errors to bucket j, or to the untimed count when j is None."""
        if count <= 0:
            return
        if j is None:
            self.untimed += count
        else:
            self.counts[j] = self.counts.get(j, 0) + count

    def note_first(self, line: int, text: str, above: Sequence[tuple[int, str]]) -> None:
        """Record the first error line and the lines just above it (line number, text)."""
        self.first = Line(line, clean_line(text))
        self.above = [Line(n, clean_line(t)) for n, t in above if t.strip()]

    def note_last(self, text: str) -> None:
        """Record the latest error line seen so far (its text and time)."""
        self.last = clean_line(text)
        t = self.time_in(text.encode("utf-8", "replace"))
        if t is not None:
            self.last_time = t

    def times(self) -> list[float]:
        """One time per timed error, ascending: each at its bucket's end (exact for the checks)."""
        out: list[float] = []
        for j in sorted(self.counts):
            out += [float(self.bucket_end(j))] * self.counts[j]
        return out

    def check_counts(self, times: Sequence[float]) -> list[tuple[float, int]]:
        """(check time, errors in its window) for every check from the first error to the last + window."""
        assert self.start is not None
        rule = self.rule
        end = (times[-1] if times else self.start) + rule.window
        out = []
        t = self.start + rule.interval
        while t <= end:
            out.append((t, count_in_window(times, t, rule.window)))
            t += rule.interval
        return out


def _hhmmss(t: float) -> str:
    s = int(t) % 86400
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


@dataclass(frozen=True)
class _Watch:
    """The watchdog replayed over the timed 503 lines of one log (times in Unix seconds)."""

    first_t: int
    last_t: float
    most: int
    """The most checks in a row above the limit, over every check to the end of the errors."""
    peak: int
    """The highest count of one check."""
    replay: WatchdogReplay
    details: dict[str, Any]


def _watch(errors: EngineErrors) -> _Watch:
    """Replay the watchdog over `errors` (which must have begun with a timed line)."""
    rule = errors.rule
    times = errors.times()
    assert errors.start is not None
    first_t = errors.start
    last_t = errors.last_time if errors.last_time is not None else (times[-1] if times else first_t)
    checks = errors.check_counts(times)
    run = most = 0
    for _, n in checks:
        run = run + 1 if n > rule.limit else 0
        most = max(most, run)
    peak = max((n for _, n in checks), default=0)
    replay = replay_rule(
        times, rule, start=float(first_t), end=float(checks[-1][0]) if checks else float(first_t)
    )
    details: dict[str, Any] = {
        "count": errors.total,
        "untimed": errors.untimed,
        "first_time": _hhmmss(first_t),
        "last_time": _hhmmss(last_t),
        "span_s": last_t - first_t,
        "peak_per_window": peak,
        "most_checks_in_a_row": most,
        "rule": {
            "limit": rule.limit,
            "checks": rule.checks,
            "interval_s": rule.interval,
            "window_s": rule.window,
        },
        "stopped_after_s": None if replay.stopped_at is None else replay.stopped_at - first_t,
        "last_503": trim_line(errors.last) if errors.last else None,
        "timed": True,
    }
    return _Watch(first_t=first_t, last_t=last_t, most=most, peak=peak, replay=replay, details=details)


@register
class DeadEngine(Rule):
    """503 errors that never stop: the watchdog rule stops the run. Without times on the 503 lines the
    rule cannot be applied: a warning above the limit's count, else info."""

    id = "dead_engine"
    severity = "error"
    counted_needle = DEAD_ENGINE_NEEDLE
    judged_last = True  # the finding names the errors above the first 503
    fix = (
        "Stop the run, fix the cause above the first 503, and start every unattended run with "
        "`grpolab watchdog` (it stops such a run about five minutes after the errors start)."
    )
    source = f"{MANUAL_WATCHDOG}; {MANUAL_TROUBLE} (The GPU is idle and the log keeps growing)"

    def __init__(self, log: LogRules) -> None:
        super().__init__(log)
        self.errors = EngineErrors(log.options.watchdog)

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        errors = self.errors
        if errors.total == 0 or errors.first is None:
            return []
        rule = errors.rule
        first = errors.first
        evidence = [self.ev(first, "first 503")] + [self.ev(ln, "above the first 503") for ln in errors.above]
        evidence.sort(key=lambda e: e.line)
        above = [f for f in earlier if f.severity == "error" and 0 < f.first_line < first.line]
        above_text = (
            " Above the first 503: "
            + "; ".join(f"{f.rule} at line {f.first_line} ({f.title})" for f in above)
            + "."
            if above
            else " Read the engine lines above the first 503 for the reason it died."
        )
        if not errors.timed:
            return [self._untimed(evidence, above_text)]
        watch = _watch(errors)
        if watch.replay.stopped_at is None:
            return []  # bursts: Engine503Bursts
        kv_before = [ln for ln, _ in self.log.rule(EngineOomStart).kv if ln.line < first.line]
        start_note = (
            " The engine had started (KV cache allocated) before the first 503."
            if kv_before
            else " No `KV Cache is allocated` line precedes the first 503: an SGLang engine never finished starting."
        )
        untimed = f" ({errors.untimed:,} of them without a time)" if errors.untimed else ""
        first_t, last_t = watch.first_t, watch.last_t
        return [
            self.finding(
                f"the rollout engine died: {errors.total:,} × 503 Service Unavailable over "
                f"{_minutes(last_t - first_t)}; the watchdog rule stops the run "
                f"{_minutes(watch.replay.stopped_at - first_t)} after the first",
                evidence,
                watch.details,
                cause=(
                    f"The 503 errors never stopped: more than {rule.limit} in every {rule.window:g} s window for "
                    f"{plural(watch.most, 'check')} in a row (peak {watch.peak:,}), from {_hhmmss(first_t)} to "
                    f"{_hhmmss(last_t)}{untimed}. The router answers 503 when no engine can take a request; the "
                    "trainer keeps sending requests to a dead engine and the run never fails by itself."
                    + start_note
                    + above_text
                ),
            )
        ]

    def _untimed(self, evidence: list[Evidence], above_text: str) -> Finding:
        """503 lines without times: counted only (a warning above the limit, else info)."""
        total = self.errors.total
        return self.finding(
            f"{total:,} × 503 Service Unavailable without timestamps: the watchdog's time rule "
            "could not be applied (count only)",
            evidence,
            {"count": total, "timed": False},
            severity="warning" if total > self.errors.rule.limit else "info",
            cause=(
                "A dead rollout engine and a busy healthy one both write 503 errors; only their times "
                "tell them apart, and these lines carry none." + above_text
            ),
            fix=(
                "Look at the run live: `grpolab watchdog LOG` stamps lines as they are written. Stop "
                "the run if the errors never stop and the GPU is idle."
            ),
            source=MANUAL_WATCHDOG,
        )


@register
class Engine503Bursts(Rule):
    """Timed 503 errors that the watchdog rule lets pass (a busy engine's bursts): info."""

    id = "engine_503_bursts"
    severity = "info"
    fix = "Nothing to do for the 503s by themselves; read the other findings if the run failed."
    source = MANUAL_WATCHDOG

    def findings(self, earlier: Sequence[Finding]) -> list[Finding]:
        errors = self.log.rule(DeadEngine).errors
        if errors.total == 0 or errors.first is None or not errors.timed:
            return []
        watch = _watch(errors)
        if watch.replay.stopped_at is not None:
            return []  # DeadEngine
        rule, most = errors.rule, watch.most
        untimed = f" ({errors.untimed:,} of them without a time)" if errors.untimed else ""
        met = (
            f"at most {plural(most, 'check')} in a row above {rule.limit}"
            if most
            else f"no check counted more than {rule.limit}"
        )
        return [
            self.finding(
                f"{errors.total:,} × 503 Service Unavailable: the dead-engine rule is not met ({met}; it needs "
                f"{rule.checks} in a row)",
                (self.ev(errors.first, "first 503"),),
                watch.details,
                cause=(
                    f"The 503s ran from {_hhmmss(watch.first_t)} to {_hhmmss(watch.last_t)}{untimed}, at most "
                    f"{watch.peak:,} in {rule.window:g} s. The rule (every {rule.interval:g} s count the last "
                    f"{rule.window:g} s; stop after {rule.checks} counts above {rule.limit} in a row) stops only "
                    "errors that never stop: a busy engine answers 503 in bursts of up to about a minute and the "
                    "client retries."
                ),
            )
        ]
