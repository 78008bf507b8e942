"""`--use-pytorch-profiler`: torch.profiler over a window of steps, one gzipped Chrome trace per window.

Counting follows Miles' monitoring page (reference/miles-monitoring.md, "Built-in PyTorch profiler"):
with `--profile-target train_overall` a step is one rollout step (the loop's iteration for rollout id
k, its eval included) and rollouts `--profile-step-start` .. `--profile-step-end - 1` are traced
into one trace; with `train_actor` / `train_log_probs` a step is one micro-batch of the training
forward/backward / of the policy's log-prob forward, the index restarts at every optimizer window,
and each window's micro-batches start .. end-1 become one trace. Micro-batches are counted by a
forward pre-hook on the policy model (grad enabled: training; disabled: log-probs), so the actor
needs no profiler code; each traced forward is a `grpolab/micro_batch_<i>` range. A forward of the
other kind, the optimizer step (train_actor), the end of the window's last log-prob forward
(train_log_probs) and the end of the rollout step end a micro-batch window; the reference model's
forward is not counted and does not touch the window.

Phase names come from `PhaseTimer` (core/metrics.py), which opens a `grpolab/<phase>` record_function
range around every timed phase; the loop's step adds `grpolab/rollout_step_<k>`. Outside a window no
profiler runs: the cost is the record_function ranges and a hook call per micro-batch
(benchmarks/bench_profiler.py measures it).

Traces are `<dir>/rank<r>.<target>.rollout<k>[.window<w>].pt.trace.json.gz`, dir being
`--tensorboard-dir` or RUN_DIR/profile; each written trace is a `profiler_trace` event (absolute path, bytes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from grpolab.core.config.monitoring import ProfilingConfig
from grpolab.monitor.checks import check_memory_recorder, check_profile_ranks, profiling_warnings
from grpolab.monitor.memory import MemoryRecorder

log = logging.getLogger("grpolab")

TRACE_SUFFIX = ".pt.trace.json.gz"
"""torch's tensorboard_trace_handler suffix (gzipped Chrome trace JSON); the UI lists files by it."""
STEP_RANGE = "grpolab/rollout_step_{}"
"""record_function name of the loop's iteration for one rollout id."""
MICRO_BATCH_RANGE = "grpolab/micro_batch_{}"
"""record_function name of a traced policy forward, by its index in its optimizer window."""


def trace_dir(tensorboard_dir: str | None, run_dir: Path) -> Path:
    """Where traces go: `--tensorboard-dir` when given, else RUN_DIR/profile (Miles monitoring page)."""
    return Path(tensorboard_dir) if tensorboard_dir else run_dir / "profile"


class RunProfiler:
    """The profiler of one rank of one run; every method is a no-op when this rank is not traced.

    Use: `with profiler.rollout_step(k): ...` around each loop iteration, `attach(actor)` once the
    actor exists (micro-batch targets), `close()` when the run ends however it ends.
    """

    def __init__(
        self,
        cfg: ProfilingConfig,
        out_dir: Path,
        *,
        rank: int,
        cuda: bool,
        on_trace: Callable[[Path, int], None] | None = None,
    ) -> None:
        """`on_trace(path, bytes)` is called for each written trace (the loop records an event)."""
        self.cfg, self.out_dir, self.rank = cfg, out_dir, rank
        self.enabled = cfg.use_pytorch_profiler and (not cfg.profile_ranks or rank in cfg.profile_ranks)
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.on_trace = on_trace
        self._prof: profile | None = None
        self._name = ""
        self._rollout_id = -1
        self._counts = {True: 0, False: 0}  # micro-batches seen this rollout, by grad mode
        self._per_window = 1
        self._hooks: list[Any] = []
        self._range: Any = None  # the open grpolab/micro_batch_<i> record_function, if any
        self._index = -1  # index of the policy micro-batch now running in its optimizer window

    @classmethod
    def for_run(cls, config: Any, run_dir: Any, rank: int) -> RunProfiler:
        """The profiler of a run (`config`: core.config.Config; `run_dir`: rundir.writer.RunDirectory,
        which gets a `profiler_trace` event per trace)."""
        return cls(
            config.profiling,
            trace_dir(config.monitoring.tensorboard_dir, run_dir.path),
            rank=rank,
            cuda=torch.device(config.model.device).type == "cuda",
            on_trace=lambda path, size: run_dir.event(
                "profiler_trace", path=str(path.absolute()), bytes=size
            ),
        )

    def attach_actor(self, actor: Any) -> None:
        """Count the micro-batches of `actor` (core.actor.Actor; None without a trainer)."""
        if actor is None:
            return
        micro = actor.opt_cfg.micro_batch_size
        self.attach(actor.model, per_window=-(-actor.local_batch_size // micro))
        self.attach_optimizer(actor.optimizer)

    # ------------------------------------------------------------------ session
    def _start(self, name: str) -> None:
        self._prof = profile(
            activities=self.activities,
            record_shapes=self.cfg.pytorch_profiler_collect_shapes,
            with_stack=self.cfg.pytorch_profiler_collect_callstack,
        )
        self._name = name
        self._prof.start()

    def _stop(self) -> None:
        """Stop the running session, if any, and write its gzipped Chrome trace."""
        self._end_range()
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.stop()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank{self.rank}.{self._name}{TRACE_SUFFIX}"
        prof.export_chrome_trace(str(path))  # torch gzips a path ending in .gz
        size = path.stat().st_size
        log.info(f"profiler: wrote {path} ({size / 1e6:.1f} MB)")
        if self.on_trace is not None:
            self.on_trace(path, size)

    # ------------------------------------------------------------------ rollout steps
    @contextmanager
    def rollout_step(self, rollout_id: int) -> Iterator[None]:
        """Around the loop's iteration for `rollout_id` (its eval, then its step)."""
        if not self.enabled:
            yield
            return
        self._rollout_id = rollout_id
        self._counts = {True: 0, False: 0}
        overall = self.cfg.profile_target == "train_overall"
        start, end = self.cfg.profile_step_start, self.cfg.profile_step_end
        if overall and start <= rollout_id < end and self._prof is None:
            self._start(f"train_overall.rollout{rollout_id}")
        try:
            with record_function(STEP_RANGE.format(rollout_id)):
                yield
        finally:
            if not overall or rollout_id >= end - 1:
                self._stop()

    # ------------------------------------------------------------------ micro-batches
    def attach(self, model: torch.nn.Module, *, per_window: int) -> None:
        """Count micro-batches of `model` (train_actor / train_log_probs targets; no-op otherwise).

        Args:
            per_window: micro-batches of one optimizer window, ceil(local batch / --micro-batch-size);
                the micro-batch index is the count since the rollout began modulo this.
        """
        if not self.enabled or self.cfg.profile_target == "train_overall":
            return
        self._per_window = max(per_window, 1)
        self._hooks.append(
            model.register_forward_pre_hook(lambda *_: self._micro_batch(torch.is_grad_enabled()))
        )
        self._hooks.append(model.register_forward_hook(lambda *_: self._after_micro_batch()))

    def attach_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        """End a train_actor window at its optimizer step (no-op for the other targets)."""
        if self.enabled and optimizer is not None and self.cfg.profile_target == "train_actor":
            self._hooks.append(optimizer.register_step_post_hook(lambda *_: self._stop()))

    def _micro_batch(self, training: bool) -> None:
        """A forward of the policy model begins: start or stop a window at this micro-batch, and open
        its `grpolab/micro_batch_<i>` range while a window runs."""
        if training != (self.cfg.profile_target == "train_actor"):
            self._stop()  # the other kind of forward: the target's loop is over
            return
        count = self._counts[training]
        self._counts[training] = count + 1
        window, self._index = divmod(count, self._per_window)
        if self._index == self.cfg.profile_step_end or self._index == 0:
            self._stop()
        if self._index == self.cfg.profile_step_start and self._prof is None:
            self._start(f"{self.cfg.profile_target}.rollout{self._rollout_id}.window{window}")
        if self._prof is not None:
            self._range = record_function(MICRO_BATCH_RANGE.format(self._index))
            self._range.__enter__()

    def _after_micro_batch(self) -> None:
        """A forward of the policy model ended: close its range; a log-prob window ends after its last
        micro-batch (end - 1, or the optimizer window's last), so the forward that follows (the
        reference's) is not traced. A train_actor window waits for the backward (ended by the next
        forward or the optimizer step)."""
        self._end_range()
        if self.cfg.profile_target != "train_log_probs" or self._prof is None:
            return
        if self._index + 1 >= min(self.cfg.profile_step_end, self._per_window):
            self._stop()

    def _end_range(self) -> None:
        opened, self._range = self._range, None
        if opened is not None:
            opened.__exit__(None, None, None)

    def close(self) -> None:
        """Write a trace still running (the run ended inside the window) and remove the hooks."""
        self._stop()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class RunProfiling:
    """The profiler and the memory recorder of one rank of a run: the loop's one handle on both.

    Use: `RunProfiling.check(config, world_size=...)` at start, then `with profiling.rollout_step(k):`
    around each loop iteration (the memory recorder starts at the first), `after_train(k)` once
    rollout k's optimizer steps are done, `on_error(e, k)` when the run fails, `close(k)` at the end.
    """

    def __init__(self, config: Any, run_dir: Any, rank: int, actor: Any) -> None:
        """`config`: core.config.Config; `run_dir`: rundir.writer.RunDirectory; `actor`: core.actor.Actor
        or None (no trainer)."""
        self.profiler = RunProfiler.for_run(config, run_dir, rank)
        self.profiler.attach_actor(actor)
        target = config.profiling.profile_target
        if self.profiler.enabled and actor is None and target != "train_overall":
            log.info(
                f"warning: --profile-target {target}: this run builds no trainer; nothing will be traced"
            )
        self.memory = MemoryRecorder.for_run(config, run_dir, rank)
        self._started = False

    @staticmethod
    def check(config: Any, *, world_size: int) -> None:
        """Check the profiling flags against this machine and world; log the warnings.

        Raises:
            ValueError: a `--profile-ranks` rank outside the world; a memory recorder this machine
                cannot run (monitor/checks.py; preflight already checked both).
        """
        check_profile_ranks(config.profiling, world_size=world_size)
        check_memory_recorder(config.profiling)
        for warning in profiling_warnings(config.profiling, num_rollout=config.rollout.num_rollout):
            log.info(warning)

    @contextmanager
    def rollout_step(self, rollout_id: int) -> Iterator[None]:
        """Around the loop's iteration for `rollout_id`; the first one starts the memory recorder."""
        if not self._started:
            self._started = True
            self.memory.start(rollout_id)
        with self.profiler.rollout_step(rollout_id):
            yield

    def after_train(self, rollout_id: int) -> None:
        """Rollout `rollout_id` has trained: the memory snapshot when it is rollout N-1."""
        self.memory.after_train(rollout_id)

    def on_error(self, error: BaseException, rollout_id: int) -> None:
        """The run is failing with `error`: write the trace still open and stop the memory recorder (a
        CUDA OOM dumps the torch snapshot), so that their events come before the run's `status` event
        (the status must be the last event: rundir/status.py). Never raises: a failure to write is a
        warning line, and the run's own error is the one reported."""
        try:
            self.profiler.close()
        except Exception as e:  # noqa: BLE001 - the run is already failing with `error`
            log.info(f"warning: profiler: could not write the trace after {type(error).__name__}: {e}")
        self.memory.on_error(error, rollout_id)

    def close(self, rollout_id: int) -> None:
        """The run ends: write a trace or recording still open."""
        self.profiler.close()
        self.memory.close(rollout_id)
