"""NVML's clock event ("throttle") reasons and the clean-step rule: pure, no GPU, no I/O.

Clean steps (Miles 101 manual, section 1.2 "Guard the GPU heat" and section 5.3 "Time only clean
steps"): a step whose window overlapped a thermal pause took longer for a reason that is not the
work, so times are compared over the steps that no pause touched. grpolab applies the same rule to
NVML's thermal and power clock reasons: `throttle_times` lists the samples that saw one and
`clean_step_mask` keeps the steps whose window holds none of them.

The samples are gpu.jsonl lines (written by `grpolab.diagnose.gpu.GpuSampler` from
`grpolab.diagnose.gpu.nvml` readings) or other tools' files with the same fields.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClockReason:
    """One bit of NVML's clock event reason mask and what it says about a step's time."""

    bit: int
    """The bit in nvmlDeviceGetCurrentClocksEventReasons' mask (nvml.h `nvmlClocksEventReason*`)."""
    name: str
    """The readable name written to gpu.jsonl `throttle_reasons`."""
    kinds: tuple[str, ...]
    """"thermal" and/or "power" when the reason slows the GPU for a cause that is not the work."""


CLOCK_REASONS: tuple[ClockReason, ...] = (
    ClockReason(0x001, "gpu_idle", ()),
    ClockReason(0x002, "applications_clocks_setting", ()),
    ClockReason(0x004, "sw_power_cap", ("power",)),
    ClockReason(0x008, "hw_slowdown", ("thermal", "power")),
    ClockReason(0x010, "sync_boost", ()),
    ClockReason(0x020, "sw_thermal_slowdown", ("thermal",)),
    ClockReason(0x040, "hw_thermal_slowdown", ("thermal",)),
    ClockReason(0x080, "hw_power_brake_slowdown", ("power",)),
    ClockReason(0x100, "display_clocks_setting", ()),
    ClockReason(0x200, "board_limit", ()),
    ClockReason(0x400, "reliability", ()),
)
"""NVML's clock event reason bits (nvml.h, `nvmlClocksEventReason*`, formerly
`nvmlClocksThrottleReason*`; same values) with grpolab's reading of each.

Counted as a throttle (the step was slowed by heat or power, not by its work):
sw_power_cap ("the clocks have been optimized to ensure not to exceed currently set power
limits"), sw/hw_thermal_slowdown, hw_power_brake_slowdown, and hw_slowdown, which NVML documents
as either "temperature being too high", an external power brake or a power draw too high, so it
is both kinds unless a more specific hw bit is set with it. Not counted: gpu_idle (nothing runs:
the step is waiting, not slowed), clocks held by an application/display setting, sync boost
(a group policy, not heat), and board_limit / reliability, which NVML documents by name only.
"""

_KNOWN_BITS = sum(reason.bit for reason in CLOCK_REASONS)
_KINDS_BY_NAME = {reason.name: reason.kinds for reason in CLOCK_REASONS}
_HW_SPECIFIC = frozenset({"hw_thermal_slowdown", "hw_power_brake_slowdown"})


def decode_clock_reasons(mask: int) -> list[str]:
    """Names of every bit set in an NVML clock event reason mask, in bit order.

    Bits grpolab does not know are kept as "unknown_0x…" so nothing is dropped.

    Raises:
        ValueError: a negative mask.
    """
    if mask < 0:
        raise ValueError(f"a clock event reason mask is a non-negative bit mask, got {mask}")
    names = [reason.name for reason in CLOCK_REASONS if mask & reason.bit]
    rest, bit = mask & ~_KNOWN_BITS, 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def reason_kinds(name: str) -> tuple[str, ...]:
    """ "thermal"/"power" for one reason name; () for a reason that is not a throttle.

    A name of CLOCK_REASONS (in any case, with spaces or dashes for underscores: nvidia-smi's
    "HW Slowdown") gets that reason's kinds. Other tools' spellings (DCGM's "HW_POWER_BRAKE", a
    shortened "sw_thermal") are read by their words: a name mentioning "thermal" is thermal, one
    mentioning "power" is power.
    """
    key = name.strip().lower().replace(" ", "_").replace("-", "_")
    known = _KINDS_BY_NAME.get(key)
    if known is not None:
        return known
    return tuple(kind for kind in ("thermal", "power") if kind in key)


def throttle_kinds(names: Iterable[str]) -> list[str]:
    """The throttle kinds ("thermal", "power", in that order) of a list of active reason names.

    A bare "hw_slowdown" counts as both kinds; next to hw_thermal_slowdown or
    hw_power_brake_slowdown it adds nothing (those bits say which one it is).
    """
    names = list(names)
    specific = any(n in _HW_SPECIFIC for n in names)
    kinds: set[str] = set()
    for name in names:
        if name == "hw_slowdown" and specific:
            continue
        kinds.update(reason_kinds(name))
    return [kind for kind in ("thermal", "power") if kind in kinds]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def sample_is_throttled(sample: Mapping[str, Any]) -> bool:
    """Whether one gpu.jsonl sample saw a thermal or power throttle.

    Uses the sample's `throttle` field when it has a value; otherwise (files without it, or other
    tools' files) the thermal/power names in `throttle_reasons` (a list of names, or a raw NVML
    mask). A null or missing field (the GPU could not report reasons) is not a throttle; neither
    is gpu_idle.
    """
    flag = sample.get("throttle")
    if not _missing(flag):
        return bool(flag)
    reasons = sample.get("throttle_reasons")
    if isinstance(reasons, bool) or _missing(reasons):
        return False
    if isinstance(reasons, numbers.Real):
        mask = float(reasons)
        return math.isfinite(mask) and mask >= 0 and bool(throttle_kinds(decode_clock_reasons(int(mask))))
    if isinstance(reasons, str):
        reasons = [reasons]
    try:
        return bool(throttle_kinds(str(name) for name in reasons))
    except TypeError:  # not a list of names: no usable reason
        return False


def throttle_times(samples: Iterable[Mapping[str, Any]]) -> list[float]:
    """Sorted Unix times (seconds) of the samples that saw a thermal or power throttle.

    Samples without a usable `time` are skipped.
    """
    times = []
    for sample in samples:
        t = sample.get("time")
        if isinstance(t, numbers.Real) and not isinstance(t, bool) and math.isfinite(t):
            if sample_is_throttled(sample):
                times.append(float(t))
    return sorted(times)


def clean_step_mask(
    step_ends: Sequence[float | None],
    step_durations: Sequence[float | None],
    throttle_times: Sequence[float],
    *,
    margin_s: float = 0.0,
) -> list[bool]:
    """Which steps are clean: no throttled sample inside [end − duration − margin, end + margin].

    Miles 101 manual, lab notes, "The timing rule": the window ends at the timestamp of the metrics
    line and lasts perf/step_time (perf/rollout_time for rollout times); "a step counts when that
    window overlaps no pause". Both edges are inclusive.

    margin_s (seconds, default 0) widens the window on both sides. grpolab's default is not to
    widen: a sample shows the GPU at one instant, so a throttle that this rule misses overlapped
    the step by less than one sample interval (1 s by default, against steps of tens of seconds),
    while widening by the interval would also drop neighbouring steps that no throttle touched.
    Pass the sample interval to be strict.

    Args:
        step_ends: Unix time (s) at which each step ended; None/NaN = unknown.
        step_durations: each step's length (s); None/NaN counts as 0 (the window is its end).
        throttle_times: Unix times (s) of throttled samples (`throttle_times`), any order.
        margin_s: seconds added on both sides of every window.

    Returns:
        One bool per step (True = clean). With no throttled sample every step is clean; otherwise
        a step with an unknown end is not (it cannot be shown clear).

    Raises:
        ValueError: the two step sequences differ in length, or margin_s < 0.
    """
    if len(step_ends) != len(step_durations):
        raise ValueError(
            f"clean_step_mask: {len(step_ends)} step ends but {len(step_durations)} step durations"
        )
    if not margin_s >= 0:
        raise ValueError(f"clean_step_mask: margin_s must be >= 0 seconds, got {margin_s}")
    marks = sorted(float(t) for t in throttle_times)
    if not marks:
        return [True] * len(step_ends)
    clean = []
    for end, duration in zip(step_ends, step_durations, strict=True):
        if _missing(end):
            clean.append(False)
            continue
        length = 0.0 if _missing(duration) else float(duration)
        lo = bisect.bisect_left(marks, float(end) - length - margin_s)
        hi = bisect.bisect_right(marks, float(end) + margin_s)
        clean.append(hi <= lo)
    return clean
