"""Exporting grpolab checkpoints for serving: `grpolab convert --to-hf` (to_hf.py; the command: command.py).
A room on the floor above `core`; importing it imports no torch."""
