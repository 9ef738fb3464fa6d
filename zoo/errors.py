"""One error type for everything a user can get wrong, each with the fix spelled out.

The CLI prints `problem` and `fix` as one paragraph and exits non-zero; tracebacks are for bugs, not for
bad input.
"""

from __future__ import annotations


class ZooError(Exception):
    """A failure the user can act on: what went wrong, and what to do about it."""

    exit_code = 2

    def __init__(self, problem: str, fix: str):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} Fix: {fix}")


class GateFailure(ZooError):
    """A bundle converted but did not match its reference; it is kept aside, never published."""

    exit_code = 1
