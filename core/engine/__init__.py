"""Rollout engines: the protocol and capabilities (base), the retrying client, the in-process torch
engine, and the factory that builds the run's engine from the config."""
