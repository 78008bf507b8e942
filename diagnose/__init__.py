"""Diagnose a run that misbehaves, in rooms by job (each subpackage's __init__ is its door):

- `hang/`: `grpolab diagnose hang`, the py-spy sweep over every rank and its verdict
  (`hang/verdict/`: the pure classifier and the words of each verdict);
- `logdoctor/`: `grpolab diagnose log`, the log scanner and its rule families (`logdoctor/rules/`);
- `watchdog/`: `grpolab watchdog`, which stops a run whose rollout engine died;
- `gpu/`: `grpolab diagnose gpu` and the NVML sampler that writes RUN_DIR/gpu.jsonl;
- `common/`: what several rooms share (the dead-engine rule, /proc readers, rank-error order, wording,
  CLI flag helpers). A room imports `common/`, the run directory's reader (`grpolab.rundir`), two small
  core utilities (`core.atomic`, `core.registry`) and its own modules, never another room; `cli.py`
  wires every command into the `grpolab` parser.

Code outside diagnose/ imports a room's door (`from grpolab.diagnose.gpu import start_run_sampler`).
Nothing here imports torch at import time.
"""
