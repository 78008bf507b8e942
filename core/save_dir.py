"""What a `--save` directory holds, named without torch, for the checks before a run and the trainer.

`checkpoint.py` (which imports torch) writes and reads these files; `train/launch.py` checks a
`--save` directory before the run starts, without importing the trainer.
"""

from __future__ import annotations

LATEST_FILE = "latest_checkpointed_iteration.txt"
"""The file in a `--save` directory naming its newest checkpoint (written by `checkpoint.save_checkpoint`)."""
