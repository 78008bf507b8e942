"""Recording format, recorder and replayer (see the replay issue)."""
