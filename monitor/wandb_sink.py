"""A Weights & Biases run of a grpolab run's metrics (`--use-wandb`, Miles' flags and namespaces).

wandb.init gets: project `--wandb-project` (default "grpolab"), group `--wandb-group` (None when not
given: an ungrouped run; Miles crashes without one), name `--wandb-run-name` (default the run
directory's name), mode `--wandb-mode` (None: wandb's own, WANDB_MODE or online; "offline" writes the
run's .wandb transaction log and needs no network), dir `--wandb-dir` (default the run directory: wandb
makes `DIR/wandb/<mode>-run-<time>-<id>/` in it), and as its config the resolved grpolab config
(Config.to_dict(): section → field → value) plus `run_dir`, the run directory's absolute path.

Each namespace is plotted against its own step metric (`define_metric`, sinks.NAMESPACE_AXES):
train/* against train/step, rollout/* and perf/* against rollout/step, eval/* against eval/step.
The API key is wandb's business: it reads WANDB_API_KEY (or its netrc) itself; grpolab never reads,
prints or stores it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from grpolab.core.config.monitoring import MonitoringConfig
from grpolab.monitor.sinks import EXIT_CODES, NAMESPACE_AXES, with_step_key

log = logging.getLogger("grpolab")

DEFAULT_PROJECT = "grpolab"
"""wandb project when `--wandb-project` is not given."""


class WandbSink:
    """One wandb run for one start of a grpolab run (the MetricSink of `--use-wandb`).

    Attributes:
        run: the wandb Run.
        info: what run.json stores under "wandb": id (None when disabled), project, group, mode
            (online | offline | disabled), dir (the wandb run's own folder, holding run-<id>.wandb and files/; None when
            disabled), url (None unless online).

    Raises (on construction):
        ImportError: wandb is not installed (preflight's check_monitoring says so before the run).
        RuntimeError: wandb.init failed (no API key for online mode, no network, ...), naming --use-wandb.
    """

    name = "wandb"
    flag = "--use-wandb"

    def __init__(
        self, cfg: MonitoringConfig, run_dir: Path, config: dict[str, Any], *, resume_id: str | None = None
    ) -> None:
        """`resume_id`: the wandb run of an earlier start of this run directory (run.json's "wandb"
        id), continued with wandb.init(id=..., resume="allow") instead of opening a second run."""
        import wandb

        directory = Path(cfg.wandb_dir) if cfg.wandb_dir else run_dir
        directory.mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(
                project=cfg.wandb_project or DEFAULT_PROJECT,
                group=cfg.wandb_group,
                name=cfg.wandb_run_name or run_dir.name,
                mode=cfg.wandb_mode,
                dir=str(directory),
                config={**config, "run_dir": str(run_dir.resolve())},
                settings=wandb.Settings(console="off"),  # console.log is grpolab's; no stdout wrapping
                **({"id": resume_id, "resume": "allow"} if resume_id else {}),
            )
        except Exception as e:  # wandb's own errors (usage, auth, network) all end the start here
            raise RuntimeError(
                f"--use-wandb: wandb.init failed: {type(e).__name__}: {e} (online mode needs WANDB_API_KEY "
                "and network; --wandb-mode offline needs neither)"
            ) from e
        for glob, axis in NAMESPACE_AXES.items():
            self.run.define_metric(axis)
            self.run.define_metric(glob, step_metric=axis)
        mode = "disabled" if self.run.disabled else "offline" if self.run.offline else "online"
        self.info: dict[str, Any] = {
            "id": None if mode == "disabled" else self.run.id,  # a disabled run's id names nothing
            "project": self.run.project,
            "group": cfg.wandb_group,
            "mode": mode,
            "dir": None if self.run.disabled else str(Path(self.run.settings.sync_dir).resolve()),
            "url": self.run.url if mode == "online" else None,  # wandb warns when asked offline
        }
        log.info(
            f"wandb run {self.run.id} ({mode}): {self.info['url'] or self.info['dir'] or 'nothing written'}"
        )

    def log(self, kind: str, rollout_id: int, step: int | None, metrics: dict[str, float]) -> None:
        """One history row: the record's metrics plus its step metric (sinks.with_step_key)."""
        self.run.log(with_step_key(kind, rollout_id, step, metrics))

    def close(self, status: str) -> None:
        """Finish the wandb run with the status's exit code (sinks.EXIT_CODES: failed is 1), then end
        wandb's session: its service flushes and exits, and a later run in this process (tests, the
        UI's jobs) starts a session of its own instead of inheriting this one's settings (wandb warns
        "Changes to your wandb environment variables will be ignored" and the second run's history
        was found incomplete in its .wandb file)."""
        import wandb

        self.run.finish(exit_code=EXIT_CODES.get(status, 1))
        wandb.teardown()
