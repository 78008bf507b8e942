"""The hang verdict, pure (no I/O): which kind of hang every rank's stacks show, and its words.

classify.py picks the kind (AReaL debugging guide patterns) from each rank's observation
(rank_rows.py: where each rank is, from its frames as frames.py reads them); text.py, idle.py and
caveats.py write the title, evidence and next steps; env_advice.py the backend-specific advice.
"""

from grpolab.diagnose.hang.verdict.classify import VERDICT_KINDS, Verdict, classify, render_table
from grpolab.diagnose.hang.verdict.rank_rows import RankObservation

__all__ = ["VERDICT_KINDS", "RankObservation", "Verdict", "classify", "render_table"]
