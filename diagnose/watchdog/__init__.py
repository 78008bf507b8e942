"""`grpolab watchdog`: stop a run whose rollout engine died (the Miles 101 manual's 503 watchdog).

The room: the command and its replay (command.py), the live loop (live.py), following a log like
`tail -F` (follow.py), what is watched (target.py) and stopping processes like `docker stop`
(stopping.py). The rule itself is shared with the log doctor: common/dead_engine.py.
"""

from grpolab.diagnose.watchdog.command import add_watchdog_arguments, run_watchdog_command
from grpolab.diagnose.watchdog.follow import LogFollower
from grpolab.diagnose.watchdog.live import Watchdog
from grpolab.diagnose.watchdog.replay import format_replay, replay_command
from grpolab.diagnose.watchdog.stopping import stop_processes

__all__ = [
    "LogFollower",
    "Watchdog",
    "add_watchdog_arguments",
    "format_replay",
    "replay_command",
    "run_watchdog_command",
    "stop_processes",
]
