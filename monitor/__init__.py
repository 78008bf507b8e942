"""Watching a run from outside: metric sinks (wandb, TensorBoard, a custom rollout logger), the PyTorch
profiler and memory snapshots, configured by the `monitoring` and `profiling` config sections
(core/config/monitoring.py; Miles' flags, reference/miles-monitoring.md)."""
