"""Hang sweeps, log doctor and GPU sampling (see the diagnose issue)."""
