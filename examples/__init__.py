"""Small, runnable examples of grpolab's extension points (importable as `grpolab.examples.*`)."""
