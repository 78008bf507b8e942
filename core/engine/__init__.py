"""Rollout engines: the protocol and the in-process torch engine."""
