"""GPU sampling: throttle decoding, clean steps, NVML readings through a fake pynvml, the sampler
thread, the no-driver path of this machine, `grpolab diagnose gpu`, and a real NVML test (`gpu`)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import threading
import time
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
import runs

from grpolab.cli import main
from grpolab.diagnose import gpu
from grpolab.diagnose.gpu import GpuSampler, nvml, start_run_sampler
from grpolab.diagnose.gpu import sampler as gpu_sampler
from grpolab.diagnose.gpu.nvml import NoNvidiaDriver, NvmlSession
from grpolab.diagnose.gpu.throttle import (
    CLOCK_REASONS,
    clean_step_mask,
    decode_clock_reasons,
    reason_kinds,
    sample_is_throttled,
    throttle_kinds,
    throttle_times,
)


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


NVML_WORKS = _nvml_works()
no_driver_only = pytest.mark.skipif(NVML_WORKS, reason="this machine has a working NVIDIA driver")


def _wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.01)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------ throttle decoding


def test_clock_reason_bits_match_pynvml_constants() -> None:
    for reason in CLOCK_REASONS:
        suffix = "".join(part.capitalize() for part in reason.name.split("_"))
        suffix = (
            suffix.replace("ClocksSetting", "ClockSetting") if reason.name.startswith("display") else suffix
        )
        found = [
            getattr(pynvml, prefix + suffix)
            for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason")
            if hasattr(pynvml, prefix + suffix)
        ]
        assert found, f"pynvml has no constant for {reason.name} ({suffix})"
        assert set(found) == {reason.bit}, reason.name


def test_decode_clock_reasons_names_every_active_bit() -> None:
    assert decode_clock_reasons(0) == []
    assert decode_clock_reasons(pynvml.nvmlClocksEventReasonGpuIdle) == ["gpu_idle"]
    mask = (
        pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonSwThermalSlowdown | 0x1 | 0x800
    )
    assert decode_clock_reasons(mask) == ["gpu_idle", "sw_power_cap", "sw_thermal_slowdown", "unknown_0x800"]
    assert decode_clock_reasons(0x1FF) == [r.name for r in CLOCK_REASONS[:9]]
    with pytest.raises(ValueError, match="non-negative"):
        decode_clock_reasons(-1)


def test_throttle_kinds_count_only_heat_and_power() -> None:
    assert throttle_kinds(["gpu_idle", "applications_clocks_setting", "sync_boost"]) == []
    assert throttle_kinds(["display_clocks_setting", "board_limit", "reliability", "unknown_0x800"]) == []
    assert throttle_kinds(["gpu_idle", "sw_power_cap"]) == ["power"]
    assert throttle_kinds(["sw_thermal_slowdown"]) == ["thermal"]
    assert throttle_kinds(["hw_power_brake_slowdown", "hw_thermal_slowdown"]) == ["thermal", "power"]
    assert throttle_kinds(["hw_slowdown"]) == ["thermal", "power"]  # NVML: heat or power, not which
    assert throttle_kinds(["hw_slowdown", "hw_thermal_slowdown"]) == ["thermal"]
    assert throttle_kinds(["hw_slowdown", "hw_power_brake_slowdown"]) == ["power"]
    assert throttle_kinds(["SW Thermal Slowdown"]) == ["thermal"]  # nvidia-smi's spelling
    assert throttle_kinds(["HW_POWER_BRAKE"]) == ["power"]  # DCGM's
    for reason in CLOCK_REASONS:  # nvidia-smi-style spellings ("Sw Power Cap") read as the table says
        assert reason_kinds(reason.name.replace("_", " ").title()) == reason.kinds, reason.name


def test_sample_is_throttled_prefers_the_throttle_field() -> None:
    assert sample_is_throttled({"throttle": True, "throttle_reasons": []})
    assert not sample_is_throttled({"throttle": False, "throttle_reasons": ["sw_thermal_slowdown"]})
    assert sample_is_throttled({"throttle": None, "throttle_reasons": ["sw_thermal_slowdown"]})
    assert sample_is_throttled({"throttle": math.nan, "throttle_reasons": ["hw_slowdown"]})
    assert not sample_is_throttled({"throttle_reasons": ["gpu_idle"]})
    assert not sample_is_throttled({"throttle_reasons": ["gpu_idle", "applications_clocks_setting"]})
    assert sample_is_throttled({"throttle_reasons": 0x20})  # a raw NVML mask: sw thermal
    assert not sample_is_throttled({"throttle_reasons": 0x1})  # gpu idle
    assert not sample_is_throttled({"throttle_reasons": None, "throttle": None})
    assert not sample_is_throttled({"time": 1.0})


def test_throttle_times_sorted_and_skip_samples_without_time() -> None:
    samples = [
        {"time": 30.0, "throttle": True},
        {"time": 10.0, "throttle_reasons": ["sw_power_cap"]},
        {"time": 20.0, "throttle_reasons": ["gpu_idle"]},
        {"throttle": True},
        {"time": None, "throttle": True},
        {"time": math.nan, "throttle": True},
    ]
    assert throttle_times(samples) == [10.0, 30.0]
    assert throttle_times([]) == []


# ------------------------------------------------------------------ clean steps


def test_clean_step_mask_window_edges_are_inclusive() -> None:
    ends, durations = [100.0, 200.0, 300.0], [50.0, 50.0, 50.0]  # [50,100], [150,200], [250,300]
    assert clean_step_mask(ends, durations, [100.0]) == [False, True, True]  # at an end
    assert clean_step_mask(ends, durations, [150.0]) == [True, False, True]  # at a start
    assert clean_step_mask(ends, durations, [125.0, 149.999, 300.001]) == [True, True, True]  # between
    assert clean_step_mask(ends, durations, [301.0, 10.0, 275.0]) == [True, True, False]  # any order
    assert clean_step_mask(ends, durations, []) == [True, True, True]


def test_clean_step_mask_margin_widens_both_sides() -> None:
    ends, durations = [100.0, 200.0], [50.0, 50.0]
    assert clean_step_mask(ends, durations, [100.5], margin_s=0.0) == [True, True]
    assert clean_step_mask(ends, durations, [100.5], margin_s=1.0) == [False, True]
    assert clean_step_mask(ends, durations, [149.5], margin_s=1.0) == [True, False]
    with pytest.raises(ValueError, match="margin_s"):
        clean_step_mask(ends, durations, [], margin_s=-1.0)


def test_clean_step_mask_unknown_values() -> None:
    # unknown duration: the window is the end instant; unknown end: not clean once anything throttled
    assert clean_step_mask([100.0, 200.0], [None, math.nan], [150.0]) == [True, True]
    assert clean_step_mask([100.0, 200.0], [None, math.nan], [200.0]) == [True, False]
    assert clean_step_mask([None, math.nan], [10.0, 10.0], [5.0]) == [False, False]
    assert clean_step_mask([None], [10.0], []) == [True]
    with pytest.raises(ValueError, match="2 step ends but 1 step durations"):
        clean_step_mask([1.0, 2.0], [1.0], [])


def test_gpu_idle_samples_leave_steps_clean() -> None:
    samples = [
        {"time": 75.0, "throttle_reasons": ["gpu_idle"], "throttle": False},
        {"time": 175.0, "throttle_reasons": ["gpu_idle"]},  # an older file without `throttle`
        {"time": 275.0, "throttle_reasons": ["gpu_idle", "sw_thermal_slowdown"]},
    ]
    mask = clean_step_mask([100.0, 200.0, 300.0], [50.0, 50.0, 50.0], throttle_times(samples))
    assert mask == [True, True, False]


# ------------------------------------------------------------------ NVML readings (fake pynvml)


class _Err:
    def __init__(self, code: int) -> None:
        self.code = code


NOT_SUPPORTED = _Err(pynvml.NVML_ERROR_NOT_SUPPORTED)
GPU_LOST = _Err(pynvml.NVML_ERROR_GPU_IS_LOST)
ABSENT = _Err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def fake_pynvml(
    gpus: list[dict[str, Any]], *, init_error: int | None = None, drop: tuple[str, ...] = ()
) -> types.SimpleNamespace:
    """A pynvml stand-in with the real error classes; `gpus[i][field]` is a value or an _Err."""
    nv = types.SimpleNamespace(calls={}, shutdowns=0)
    for name in dir(pynvml):
        if name.startswith(("NVMLError", "NVML_ERROR_")) or name in ("NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM"):
            setattr(nv, name, getattr(pynvml, name))

    def value(handle: int, field: str) -> Any:
        nv.calls[field] = nv.calls.get(field, 0) + 1
        v = gpus[handle].get(field, NOT_SUPPORTED)
        if isinstance(v, _Err):
            raise pynvml.NVMLError(v.code)
        return v

    def init() -> None:
        if init_error is not None:
            raise pynvml.NVMLError(init_error)

    def shutdown() -> None:
        nv.shutdowns += 1

    def temperature(handle: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return value(handle, "temperature")

    def temperature_v(handle: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return value(handle, "temperature_v")

    def clock(handle: int, kind: int) -> int:
        assert kind == pynvml.NVML_CLOCK_SM
        return value(handle, "sm_clock")

    def handle_by_index(index: int) -> int:
        return value(index, "handle")

    functions = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetName": lambda h: value(h, "name"),
        "nvmlDeviceGetUUID": lambda h: value(h, "uuid"),
        "nvmlDeviceGetUtilizationRates": lambda h: value(h, "utilization"),
        "nvmlDeviceGetMemoryInfo": lambda h: value(h, "memory"),
        "nvmlDeviceGetTemperature": temperature,
        "nvmlDeviceGetTemperatureV": temperature_v,
        "nvmlDeviceGetClockInfo": clock,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: value(h, "event_reasons"),
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: value(h, "throttle_reasons"),
    }
    for name, fn in functions.items():
        if name not in drop:
            setattr(nv, name, fn)
    return nv


def _gpu(**overrides: Any) -> dict[str, Any]:
    spec = {
        "handle": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-0000",
        "utilization": types.SimpleNamespace(gpu=87, memory=40),
        "memory": types.SimpleNamespace(total=150_000_000_000, free=50_000_000_000, used=100_000_000_000),
        "temperature": 71,
        "sm_clock": 1755,
        "event_reasons": 0x1 | 0x4,  # gpu_idle + sw_power_cap
    }
    spec.update(overrides)
    return spec


def _session(monkeypatch: pytest.MonkeyPatch, nv: types.SimpleNamespace) -> NvmlSession:
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: nv)
    return NvmlSession.open()


def test_reading_fields_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_pynvml([_gpu(), _gpu(handle=1, name=b"NVIDIA A100", uuid=b"GPU-1111", event_reasons=0x40)])
    with _session(monkeypatch, nv) as session:
        first, second = session.read()
    assert nv.shutdowns == 1
    assert set(first) == {
        "time",
        "index",
        "name",
        "uuid",
        "utilization_gpu",
        "memory_used_bytes",
        "memory_total_bytes",
        "temperature_c",
        "sm_clock_mhz",
        "throttle_reasons",
        "throttle",
        "throttle_kind",
    }
    assert abs(first["time"] - time.time()) < 600
    assert (first["index"], first["name"], first["uuid"]) == (0, "NVIDIA H200", "GPU-0000")
    assert (first["utilization_gpu"], first["temperature_c"], first["sm_clock_mhz"]) == (87, 71, 1755)
    assert (first["memory_used_bytes"], first["memory_total_bytes"]) == (100_000_000_000, 150_000_000_000)
    assert first["throttle_reasons"] == ["gpu_idle", "sw_power_cap"]
    assert (first["throttle"], first["throttle_kind"]) == (True, ["power"])
    assert (second["index"], second["name"], second["uuid"]) == (
        1,
        "NVIDIA A100",
        "GPU-1111",
    )  # bytes decoded
    assert (second["throttle_reasons"], second["throttle"], second["throttle_kind"]) == (
        ["hw_thermal_slowdown"],
        True,
        ["thermal"],
    )
    json.dumps(first)  # a reading is plain JSON


def test_idle_gpu_reading_is_not_a_throttle(monkeypatch: pytest.MonkeyPatch) -> None:
    with _session(monkeypatch, fake_pynvml([_gpu(event_reasons=0x1)])) as session:
        (reading,) = session.read()
    assert (reading["throttle_reasons"], reading["throttle"], reading["throttle_kind"]) == (
        ["gpu_idle"],
        False,
        [],
    )


def test_unsupported_fields_are_null_and_other_errors_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _gpu(utilization=NOT_SUPPORTED, temperature=NOT_SUPPORTED, event_reasons=NOT_SUPPORTED)
    spec["throttle_reasons"] = NOT_SUPPORTED
    spec["sm_clock"] = GPU_LOST
    with _session(monkeypatch, fake_pynvml([spec])) as session:
        (reading,) = session.read()
    assert reading["utilization_gpu"] is None and reading["temperature_c"] is None
    assert (
        reading["throttle_reasons"] is None
        and reading["throttle"] is None
        and reading["throttle_kind"] is None
    )
    assert reading["sm_clock_mhz"] is None
    assert reading["errors"] == {"sm_clock_mhz": str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))}
    assert reading["memory_total_bytes"] == 150_000_000_000
    assert not sample_is_throttled(reading)


def test_lost_handle_gives_an_all_null_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    with _session(monkeypatch, fake_pynvml([_gpu(handle=GPU_LOST)])) as session:
        (reading,) = session.read()
    assert reading["index"] == 0 and reading["name"] is None and reading["throttle"] is None
    assert set(reading["errors"]) == {"handle"}


def test_older_driver_falls_back_to_throttle_reason_call_once(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_pynvml([_gpu(event_reasons=ABSENT, throttle_reasons=0x20)])
    with _session(monkeypatch, nv) as session:
        readings = [session.read()[0] for _ in range(3)]
    assert [r["throttle_reasons"] for r in readings] == [["sw_thermal_slowdown"]] * 3
    assert readings[0]["throttle_kind"] == ["thermal"] and "errors" not in readings[0]
    assert nv.calls["event_reasons"] == 1  # the missing call is not retried every sample
    assert nv.calls["throttle_reasons"] == 3


def test_pynvml_without_newer_or_older_names(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_pynvml(
        [_gpu(temperature_v=64, throttle_reasons=0x8)],
        drop=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperature"),
    )
    with _session(monkeypatch, nv) as session:
        (reading,) = session.read()
    assert reading["temperature_c"] == 64
    assert reading["throttle_reasons"] == ["hw_slowdown"] and reading["throttle_kind"] == ["thermal", "power"]
    nv = fake_pynvml(
        [_gpu()], drop=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    )
    with _session(monkeypatch, nv) as session:
        (reading,) = session.read()
    assert reading["throttle_reasons"] is None and "throttle_reasons" in reading["errors"]


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver (NVML library not found)"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "no NVIDIA driver (driver not loaded)"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVIDIA driver not usable (NVML: Insufficient Permissions)"),
    ],
)
def test_init_failures_raise_no_nvidia_driver(
    monkeypatch: pytest.MonkeyPatch, code: int, message: str
) -> None:
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: fake_pynvml([], init_error=code))
    with pytest.raises(NoNvidiaDriver) as error:
        nvml.read_gpus()
    assert str(error.value) == message


# ------------------------------------------------------------------ the sampler


def test_sampler_writes_injected_readings_and_stops(tmp_path: Path) -> None:
    path = tmp_path / "gpu.jsonl"
    path.write_text('{"time": 1.0, "index": 0}\n')  # append mode: earlier lines stay
    ticks = iter(range(10**6))

    def read() -> list[dict[str, Any]]:
        n = next(ticks)
        return [
            {"time": float(n), "index": 0, "throttle": n == 1},
            {"time": float(n), "index": 1, "throttle": False},
        ]

    sampler = GpuSampler(path, 0.02, read=read)
    assert sampler.start()
    _wait_for(lambda: sampler.samples_written >= 3, "3 samples")
    sampler.stop(timeout_s=60)
    assert not sampler.running
    written = sampler.samples_written
    lines = _lines(path)
    assert lines[0] == {"time": 1.0, "index": 0}
    assert len(lines) == 1 + 2 * written  # one line per GPU per sample, whole samples only
    assert [r["index"] for r in lines[1:]] == [0, 1] * written
    assert [r["time"] for r in lines[1::2]] == [float(n) for n in range(written)]
    assert throttle_times(lines) == [1.0]
    time.sleep(0.1)
    assert len(_lines(path)) == len(lines)  # nothing after stop
    sampler.stop()  # twice is fine
    with pytest.raises(RuntimeError, match="starts once"):
        sampler.start()


def test_stop_wakes_a_long_interval_at_once(tmp_path: Path) -> None:
    sampler = GpuSampler(tmp_path / "gpu.jsonl", 3600.0, read=lambda: [{"time": time.time(), "index": 0}])
    assert sampler.start()
    _wait_for(lambda: sampler.samples_written == 1, "the first sample")
    sampler.stop(timeout_s=60)  # a sleeping thread would still be waiting out its hour
    assert not sampler.running
    assert len(_lines(tmp_path / "gpu.jsonl")) == 1


def test_failing_reads_are_logged_once_and_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}

    def read() -> list[dict[str, Any]]:
        calls["n"] += 1
        if calls["n"] <= 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return [{"time": float(calls["n"]), "index": 0}]

    sampler = GpuSampler(tmp_path / "gpu.jsonl", 0.01, read=read)
    with caplog.at_level(logging.INFO, logger="grpolab"):
        assert sampler.start()
        _wait_for(lambda: sampler.samples_written >= 2, "2 samples after the failures")
        sampler.stop(timeout_s=60)
    failed = [r for r in caplog.records if "a reading failed" in r.getMessage()]
    assert len(failed) == 1 and "GPU is lost" in failed[0].getMessage()
    assert _lines(tmp_path / "gpu.jsonl")[0]["time"] == 4.0


def test_sampler_over_a_fake_nvml_closes_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nv = fake_pynvml([_gpu(), _gpu(handle=1, event_reasons=0x20)])
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: nv)
    sampler = start_run_sampler(tmp_path, 0.01)
    assert sampler is not None
    _wait_for(lambda: sampler.samples_written >= 2, "2 samples")
    sampler.stop(timeout_s=60)
    assert nv.shutdowns == 1
    lines = _lines(tmp_path / gpu.GPU_FILE)
    assert [r["index"] for r in lines[:4]] == [0, 1, 0, 1]
    assert [r["throttle"] for r in lines[:2]] == [True, True] and lines[1]["throttle_kind"] == ["thermal"]


def test_sampler_rejects_a_non_positive_interval(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for bad in (0, -1.0, math.nan):
        with pytest.raises(ValueError, match="--gpu-sample-interval"):
            GpuSampler(tmp_path / "gpu.jsonl", bad)
    with caplog.at_level(logging.INFO, logger="grpolab"):
        assert start_run_sampler(tmp_path, 0) is None
    assert not caplog.records and not (tmp_path / "gpu.jsonl").exists()
    with caplog.at_level(logging.INFO, logger="grpolab"):
        assert start_run_sampler(tmp_path, math.inf) is None  # never raises into the run
    assert [r.getMessage() for r in caplog.records] == [
        "GPU sampling off: --gpu-sample-interval must be > 0 seconds to sample, got inf"
    ]


def test_sampler_off_when_nvml_sees_no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog) -> None:
    nv = fake_pynvml([])
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: nv)
    with caplog.at_level(logging.INFO, logger="grpolab"):
        assert start_run_sampler(tmp_path, 1.0) is None
    assert [r.getMessage() for r in caplog.records] == ["GPU sampling off: NVML sees no GPU on this host"]
    assert nv.shutdowns == 1 and not (tmp_path / "gpu.jsonl").exists()


@no_driver_only
def test_no_driver_here_logs_once_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert gpu_sampler.log.name == "grpolab"  # rundir.writer.LOGGER_NAME
    sampler = GpuSampler(tmp_path / "gpu.jsonl", 0.01)
    with caplog.at_level(logging.DEBUG, logger="grpolab"):
        assert sampler.start() is False
        sampler.stop()
    assert [r.getMessage() for r in caplog.records] == [
        "GPU sampling off: no NVIDIA driver (NVML library not found)"
    ]
    assert not sampler.running and not (tmp_path / "gpu.jsonl").exists()
    with pytest.raises(NoNvidiaDriver, match="no NVIDIA driver"):
        nvml.read_gpus()


# ------------------------------------------------------------------ grpolab diagnose gpu


@no_driver_only
def test_cli_without_driver(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "gpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == "grpolab diagnose gpu: no NVIDIA driver (NVML library not found)"
    assert main(["diagnose", "gpu", "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {
        "gpus": [],
        "error": "no NVIDIA driver (NVML library not found)",
    }


def _gpu_command(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="grpolab diagnose gpu")
    gpu.add_gpu_arguments(parser)
    return gpu.run_gpu_command(parser.parse_args(list(argv)))


def test_cli_prints_a_table_and_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nv = fake_pynvml([_gpu(), _gpu(handle=1, utilization=NOT_SUPPORTED, event_reasons=0x1)])
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: nv)
    assert _gpu_command() == 0
    out = capsys.readouterr().out
    assert "GPU 0  NVIDIA H200  GPU-0000" in out and "GPU 1  NVIDIA H200" in out
    assert "93.1 / 139.7 GiB (67 %)" in out
    assert "utilization    87 %" in out and "utilization    n/a" in out
    assert "clock reasons  gpu_idle, sw_power_cap" in out and "throttle       yes (power)" in out
    assert "throttle       no" in out
    assert _gpu_command("--json") == 0
    readings = json.loads(capsys.readouterr().out)["gpus"]
    assert [r["index"] for r in readings] == [0, 1] and readings[1]["utilization_gpu"] is None
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: fake_pynvml([]))
    assert _gpu_command() == 2
    assert "NVML sees no GPU" in capsys.readouterr().err


# ------------------------------------------------------------------ a real GPU


@pytest.mark.gpu
def test_real_nvml_reading_ranges(tmp_path: Path) -> None:
    readings = nvml.read_gpus()
    assert readings, "CUDA is available but NVML sees no GPU"
    for r in readings:
        assert r["name"] and r["uuid"].startswith(("GPU-", "MIG-"))
        assert abs(r["time"] - time.time()) < 60
        assert 0 < r["memory_total_bytes"] < 2**44 and 0 <= r["memory_used_bytes"] <= r["memory_total_bytes"]
        assert r["utilization_gpu"] is None or 0 <= r["utilization_gpu"] <= 100
        assert r["temperature_c"] is None or 0 < r["temperature_c"] < 120
        assert r["sm_clock_mhz"] is None or 0 <= r["sm_clock_mhz"] < 5000
        if r["throttle_reasons"] is not None:
            assert all(not n.startswith("unknown_") for n in r["throttle_reasons"]), r["throttle_reasons"]
            assert r["throttle"] == bool(r["throttle_kind"])
        assert "errors" not in r, r["errors"]
    sampler = GpuSampler(tmp_path / "gpu.jsonl", 0.05)
    assert sampler.start()
    _wait_for(lambda: sampler.samples_written >= 2, "2 real samples")
    sampler.stop(timeout_s=60)
    lines = _lines(tmp_path / "gpu.jsonl")
    assert len(lines) == len(readings) * sampler.samples_written


# ------------------------------------------------------------------ inside `grpolab train`


def _console_lines(run_dir: Path, prefix: str) -> list[str]:
    return [line for line in (run_dir / "console.log").read_text().splitlines() if line.startswith(prefix)]


@no_driver_only
def test_train_run_without_driver_writes_no_gpu_file(tmp_path: Path) -> None:
    run_dir = runs.run(tmp_path, "cpu", "--num-rollout", "1")
    assert runs.events(run_dir, "status")[-1]["status"] == "finished"
    assert not (run_dir / gpu.GPU_FILE).exists()
    assert _console_lines(run_dir, "GPU sampling") == [
        "GPU sampling off: no NVIDIA driver (NVML library not found)"
    ]


def test_train_run_samples_gpus_on_rank0_until_the_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nv = fake_pynvml([_gpu(), _gpu(handle=1, event_reasons=0x20)])
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: nv)
    run_dir = runs.run(tmp_path, "sampled", "--num-rollout", "2", "--gpu-sample-interval", "0.1")
    assert nv.shutdowns == 1  # stopped (and NVML shut down) before train() returned
    assert not any(t.name == "grpolab-gpu-sampler" for t in threading.enumerate())
    lines = _lines(run_dir / gpu.GPU_FILE)
    assert len(lines) >= 2 and len(lines) % 2 == 0 and [r["index"] for r in lines[:2]] == [0, 1]
    start = json.loads((run_dir / "run.json").read_text())["start_time"]
    end = runs.events(run_dir, "status")[-1]["time"]
    assert all(start <= r["time"] <= end for r in lines)
    assert _console_lines(run_dir, "GPU sampling") == []
    # every step overlapped GPU 1's thermal throttle: no clean step (a step of the default run takes
    # ~0.2 s; widened by the sample interval, as the docstring says to be strict, so a sample the
    # loaded machine delayed past a step's end still counts)
    perf = runs.records(run_dir, "perf")
    ends = [r["time"] for r in perf]
    durations = [r["metrics"]["perf/step_time"] for r in perf]
    assert clean_step_mask(ends, durations, throttle_times(lines), margin_s=0.1) == [
        False,
        False,
    ]
