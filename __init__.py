"""grpolab: a colocated GRPO trainer built for debugging and reproducing RL runs."""

__version__ = "0.1.0"
