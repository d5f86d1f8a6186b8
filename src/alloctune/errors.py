"""One exception type per user-facing failure.

The CLI prints `alloctune: error: <message>` on one line and exits with `exit_code`:
2 for bad input or usage, 1 when a workload failed. Messages must say what to do.
"""

from __future__ import annotations


class AlloctuneError(Exception):
    """Base class: a failure the user can act on (never shown with a traceback)."""

    exit_code: int = 2


class InputError(AlloctuneError):
    """Bad input: a malformed file, size or argument."""


class SizeError(InputError):
    """A size string such as `6GiB` could not be parsed."""


class ConfigError(InputError):
    """An allocator setting string violates PyTorch's grammar or limits."""


class NoOOMFound(InputError):
    """Text given to `diagnose` holds no out-of-memory message."""


class TraceError(InputError):
    """A snapshot / trace file cannot be read or lacks what is needed."""


class UnsafePickleError(TraceError):
    """A pickle asked for a global (class or function): refused, it could run code.

    `refused`: the global it named (`os.system`), when it named one; lets a caller tell a
    tampered pickle from a text file whose first letters happen to be pickle opcodes.
    """

    def __init__(self, message: str = "", refused: str | None = None) -> None:
        super().__init__(message)
        self.refused = refused


class EnvironmentProblem(AlloctuneError):
    """The environment cannot do what was asked (no CUDA, no NVML, command not found)."""


class WorkloadFailed(AlloctuneError):
    """The user's workload failed for a reason other than bad input."""

    exit_code = 1
