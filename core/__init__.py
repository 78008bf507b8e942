"""The trainer: config, data, rewards, algorithms, engines, actor, weight sync, loop, run directory."""
