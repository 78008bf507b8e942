"""`grpolab diagnose hang`: py-spy every rank of a run twice, confirm the hang and classify it.

The room: finding the ranks (targets.py, `--match` in match.py), py-spy (pyspy.py, parsed by
stacks.py), the run directory's activity (activity.py), the sweep (sweep.py), the progress rule
(progress.py, pure), runs that already ended (ended.py), the report and dumps (report.py), the command
(command.py) and the pure verdict (verdict/: classifier, frames, rank rows and the words of each kind).
"""

from grpolab.diagnose.hang.command import add_hang_arguments, run_hang_command
from grpolab.diagnose.hang.match import ranks_from_match
from grpolab.diagnose.hang.progress import ProgressCheck, decide_progress
from grpolab.diagnose.hang.report import HangReport, format_report, write_dumps
from grpolab.diagnose.hang.sweep import NotConfirmed, diagnose_hang
from grpolab.diagnose.hang.targets import InspectError, RankTarget, ranks_from_pids, read_rank_files

__all__ = [
    "HangReport",
    "InspectError",
    "NotConfirmed",
    "ProgressCheck",
    "RankTarget",
    "add_hang_arguments",
    "decide_progress",
    "diagnose_hang",
    "format_report",
    "ranks_from_match",
    "ranks_from_pids",
    "read_rank_files",
    "run_hang_command",
    "write_dumps",
]
