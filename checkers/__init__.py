"""In-run checkers and offline gates (see the checkers issue)."""
