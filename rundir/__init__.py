"""The run directory: the contract between the trainer, checkers, diagnose, the UI and the benchmarks.

`writer` (used by the trainer, one writer per rank) and `reader` (everything else reads a run
through it) are the two modules that know the file layout; `foreign_logs` reads Miles/slime console
logs into the same record shape. Importing this package imports neither torch nor pandas.
"""
