"""Watching a run from outside: metric sinks (wandb, TensorBoard, a custom rollout logger), the PyTorch
profiler and memory snapshots, configured by the `monitoring` and `profiling` config sections
(core/config/monitoring.py; Miles' flags, reference/miles-monitoring.md).

The door for the sinks and the rollout logger (hub.py): `check_monitoring(config)` in preflight,
`open_monitor(config, run_dir, primary=...)` once the run directory exists, and the loop's
`Monitor.record(...)` after each metrics.jsonl record; `build_sinks(config, run_dir)` builds the
sinks alone. Nothing here imports wandb or tensorboard until a sink is built.
"""

from grpolab.monitor.hub import Monitor, build_sinks, check_monitoring, open_monitor
from grpolab.monitor.sinks import MetricSink

__all__ = ["MetricSink", "Monitor", "build_sinks", "check_monitoring", "open_monitor"]
