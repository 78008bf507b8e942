"""`/start_profile` and `/stop_profile`: torch.profiler over the server's decodes, as SGLang 0.5.23 does.

Request fields are SGLang's `ProfileReqInput` (`srt/managers/io_struct.py`; ../shared/reference/
notes-sglang-http.md §1.1): `output_dir` (default $SGLANG_TORCH_PROFILER_DIR, else /tmp),
`start_step`, `num_steps`, `activities` ("CPU", "GPU", "MEM"; default CPU and GPU), `with_stack`,
`record_shapes`, `profile_prefix`; `profile_by_stage` and `merge_profiles` are accepted and change
nothing (one stage, one rank); unknown keys are ignored, as SGLang's dataclass parsing does.

A step is one `engine.generate` call of the batcher (one batched decode; SGLang's step is one forward
batch of its scheduler). Profiling starts at once, or before the decode numbered `start_step`
(0-based, counted since the server started), and stops after `num_steps` decodes or at
`/stop_profile`. Start and stop run on the engine thread, where the decodes run. The trace is
`<output_dir>/[<profile_prefix>-]<profile_id>-TP-0.trace.json.gz` (SGLang's name for one rank;
profile_id is the start's Unix time). Answers are SGLang's texts: "Start profiling.\\n" and "Stop
profiling. This will take some time.\\n"; a start while profiling or a stop without one is a 400 with
SGLang's message (SGLang raises there), a bad field a 400 naming it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from starlette.requests import Request
from starlette.responses import Response
from torch.profiler import ProfilerActivity, profile, record_function

from grpolab.serve.http import read_object
from grpolab.serve.protocol import RequestError
from grpolab.serve.state import ServerState

log = logging.getLogger("grpolab.serve")

ACTIVITIES = ("CPU", "GPU", "MEM")
"""Accepted `activities` (SGLang's, less "RPD", the ROCm tracer)."""
DEFAULT_ACTIVITIES = ["CPU", "GPU"]
"""SGLang's default when `activities` is not given."""
DECODE_RANGE = "grpolab/decode"
"""record_function range around each decode (one `engine.generate` call) while a profile is asked for."""


@dataclass(frozen=True)
class ProfileRequest:
    """A parsed `/start_profile` body (see the module docstring for each field)."""

    output_dir: Path
    start_step: int | None
    num_steps: int | None
    activities: tuple[str, ...]
    with_stack: bool
    record_shapes: bool
    prefix: str | None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> ProfileRequest:
        """Check and default the fields of `body`.

        Raises:
            RequestError: a field of the wrong type or out of range, an unknown activity.
        """

        def field(name: str, kind: type) -> Any:
            value = body.get(name)
            if value is not None and (
                not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)
            ):
                raise RequestError(f"/start_profile: {name} must be {kind.__name__}, got {value!r}")
            return value

        start, steps = field("start_step", int), field("num_steps", int)
        if start is not None and start < 0:
            raise RequestError(f"/start_profile: start_step must be >= 0, got {start}")
        if steps is not None and steps < 1:
            raise RequestError(f"/start_profile: num_steps must be >= 1, got {steps}")
        activities = field("activities", list)
        activities = DEFAULT_ACTIVITIES if activities is None else activities
        unknown = [a for a in activities if a not in ACTIVITIES]
        if unknown or not activities:
            raise RequestError(
                f"/start_profile: activities must be among {list(ACTIVITIES)}, got {activities}"
            )
        output_dir = field("output_dir", str) or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        return cls(
            output_dir=Path(output_dir).expanduser(),
            start_step=start,
            num_steps=steps,
            activities=tuple(activities),
            with_stack=bool(field("with_stack", bool)),
            record_shapes=bool(field("record_shapes", bool)),
            prefix=field("profile_prefix", str),
        )


class ServerProfiler:
    """The profiling state of one server. It wraps the batcher's engine (`ProfiledEngine`) while a
    profile is asked for, so that decodes are counted without the batcher knowing about profiling."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.request: ProfileRequest | None = None
        self.decodes = 0  # engine.generate calls seen by the wrapper since the server started profiling
        self.written: list[Path] = []
        self._prof: profile | None = None
        self._first = 0  # decode number where the running profile started
        self._path: Path | None = None

    @property
    def in_progress(self) -> bool:
        """A profile is asked for (running, or waiting for its start_step)."""
        return self.request is not None

    def begin(self, request: ProfileRequest) -> None:
        """Arm a profile (call on the event loop; the start itself happens on the engine thread).

        Raises:
            RequestError: `output_dir` cannot be made a directory (a file, no permission); nothing is
                armed then (HTTP 400 naming output_dir).
        """
        try:
            request.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RequestError(
                f"/start_profile: output_dir {str(request.output_dir)!r} cannot be made a directory: "
                f"{e.strerror or e}"
            ) from None
        self.request = request
        batcher = self.state.batcher
        self.decodes = batcher.batches
        if not isinstance(batcher.engine, ProfiledEngine):
            batcher.engine = ProfiledEngine(batcher.engine, self)

    def before_decode(self) -> None:
        """Engine thread, before a decode: start the profile when its step has come."""
        req = self.request
        if req is None or self._prof is not None:
            return
        if req.start_step is None or self.decodes >= req.start_step:
            self.start_now()

    def after_decode(self) -> None:
        """Engine thread, after a decode: count it; stop after num_steps decodes of the profile."""
        self.decodes += 1
        req = self.request
        if req is not None and self._prof is not None and req.num_steps is not None:
            if self.decodes - self._first >= req.num_steps:
                self.finish()

    def start_now(self) -> None:
        """Engine thread: start torch.profiler with the request's activities."""
        req = self.request
        assert req is not None
        activities = [ProfilerActivity.CPU] if "CPU" in req.activities else []
        if "GPU" in req.activities and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        profile_id = f"{time.time():.6f}"
        name = f"{req.prefix}-{profile_id}" if req.prefix else profile_id
        self._path = req.output_dir / f"{name}-TP-0.trace.json.gz"
        self._prof = profile(
            activities=activities or [ProfilerActivity.CPU],
            record_shapes=req.record_shapes,
            with_stack=req.with_stack,
            profile_memory="MEM" in req.activities,
        )
        self._prof.start()
        self._first = self.decodes

    def finish(self) -> Path | None:
        """Engine thread: stop the profile and write its trace; disarm. Returns the trace (None when the
        profile never started: its start_step was not reached)."""
        prof, path, self._prof, self.request = self._prof, self._path, None, None
        batcher = self.state.batcher
        if isinstance(batcher.engine, ProfiledEngine):
            batcher.engine = batcher.engine.inner
        if prof is None or path is None:
            return None
        prof.stop()
        prof.export_chrome_trace(str(path))  # gzipped: the name ends in .gz
        self.written.append(path)
        log.info(f"profile: wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
        return path


class ProfiledEngine:
    """The batcher's engine while a profile is asked for: `generate` tells the profiler before and after
    each decode and runs inside a `grpolab/decode` range; everything else is the wrapped engine's."""

    def __init__(self, inner: Any, profiler: ServerProfiler) -> None:
        self.inner, self.profiler = inner, profiler

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped engine's generate, inside the profiler's step accounting."""
        self.profiler.before_decode()
        try:
            with record_function(DECODE_RANGE):
                return self.inner.generate(*args, **kwargs)
        finally:
            self.profiler.after_decode()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _profiler(state: ServerState) -> ServerProfiler:
    """The server's profiler (made on first use, kept on the state)."""
    prof = getattr(state, "_profiler", None)
    if prof is None:
        prof = ServerProfiler(state)
        state._profiler = prof  # type: ignore[attr-defined]
    return prof


async def start_profile(state: ServerState, request: Request) -> Response:
    """`/start_profile` (GET or POST, body optional): arm a profile; 400 when one is in progress."""
    body = await read_object(request) if request.method == "POST" else {}
    req = ProfileRequest.parse(body)
    prof = _profiler(state)
    if prof.in_progress:
        raise RequestError("Profiling is already in progress. Call /stop_profile first.")
    prof.begin(req)
    if req.start_step is None:
        await state.batcher.on_engine_thread(prof.before_decode)  # starts now, between decodes
    return Response("Start profiling.\n")


async def stop_profile(state: ServerState, request: Request) -> Response:
    """`/stop_profile` (GET or POST): stop and write the trace; 400 when no profile is in progress."""
    prof = _profiler(state)
    if not prof.in_progress:
        raise RequestError("Profiling is not in progress. Call /start_profile first.")
    await state.batcher.on_engine_thread(prof.finish)
    return Response("Stop profiling. This will take some time.\n")
