"""The one exception every in-run checker raises: `CheckFailure(checker, message)`.

It subclasses `AssertionError` because Miles' `--ci-test` harness fails with bare asserts
(`reference/notes-miles-slime-areal.md` section 3); code and CI scripts that catch
`AssertionError` keep working, while ours can read `checker` to say which invariant broke.
"""

from __future__ import annotations


class CheckFailure(AssertionError):
    """An in-run invariant failed (`--ci-test` checkers, model hashes, grad norms, numeric guard).

    Attributes:
        checker: short name of the checker that failed ("kl", "logprobs", "model_hash", "grad_norm",
            "numeric_guard", ...), for events and for `except` filters.
        message: the human-readable, possibly multi-line explanation (what was expected, what was
            found, where, and the likely cause).

    `str(e)` is `"<checker> check failed: <message>"`. The exception pickles (it crosses process
    boundaries in multi-rank runs), because `args` is exactly `(checker, message)`.
    """

    def __init__(self, checker: str, message: str) -> None:
        super().__init__(checker, message)
        self.checker = checker
        self.message = message

    def __str__(self) -> str:
        return f"{self.checker} check failed: {self.message}"
