"""The log doctor's rule families, one module each; importing this package registers every rule.

engine.py (a run or engine that cannot start or runs out of memory), announcements.py (grpolab's own
announcements), engine_gone.py (a launched engine whose process exited), run_failure.py (how a failed
`grpolab train` ends), kernels.py (kernel and weight-update crashes), nccl_timeout.py (NCCL watchdog
timeouts), metrics.py (the printed metrics), dead_engine.py (503 errors judged by the watchdog rule) and
router.py (sglang-router's errors about its engines).
"""

from grpolab.diagnose.logdoctor.rules import (
    announcements,
    dead_engine,
    engine,
    engine_gone,
    kernels,
    metrics,
    nccl_timeout,
    router,
    run_failure,
)

RULE_FAMILIES = (
    engine,
    announcements,
    engine_gone,
    run_failure,
    kernels,
    nccl_timeout,
    metrics,
    dead_engine,
    router,
)
"""The modules whose rules are registered (importing them registers them), in the order their rules are
judged: a family's rules in the order it defines them, then the `judged_last` ones."""

__all__ = ["RULE_FAMILIES"]
