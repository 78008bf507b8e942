"""`grpolab train`: the run's orchestration, above every room it composes.

The loop (`loop.train`, one GRPO step end to end), start-up (`startup`: the run directory, the run's
parts, resume), the input checks before any of it (`preflight`, `launch`: this machine and the
torchrun re-launch), the step's reports (`step_report`), the trainer's part of a step
(`train_phase`), the device's turns between engine and trainer (`colocation`) and how a run ends
(`run_end`). It composes the ground floor (`core`) with the rooms: `rundir`, `replay`, `rollout`,
`checkers`, `monitor` and `diagnose`; nothing below imports it (tests/test_layering.py).
"""
