"""`grpolab diagnose log`: scan logs for known failure signatures (rule, evidence lines, cause, fix).

The room: the command (command.py), the report (report.py), the scanner (scan.py, with needles.py and
sniff.py), the rule model and registry (model.py), every registered rule at work on one log
(ruleset.py), the rule families (rules/), what a run directory recorded of its end (run_outcome.py), the
logs a run directory holds (run_logs.py), how an engine's log ends (last_words.py) and how they are told
as one story (story.py).
"""

from grpolab.diagnose.logdoctor.command import add_log_arguments, main, run_log_command
from grpolab.diagnose.logdoctor.model import Finding, RuleOptions
from grpolab.diagnose.logdoctor.report import exit_code, render_json, render_text
from grpolab.diagnose.logdoctor.run_outcome import RunOutcome, read_run_outcome
from grpolab.diagnose.logdoctor.scan import FileScan, scan_file

__all__ = [
    "FileScan",
    "Finding",
    "RuleOptions",
    "RunOutcome",
    "add_log_arguments",
    "exit_code",
    "main",
    "read_run_outcome",
    "render_json",
    "render_text",
    "run_log_command",
    "scan_file",
]
