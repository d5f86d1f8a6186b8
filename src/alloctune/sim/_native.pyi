"""Types of the native replay core (`_native.c`, built by setup.py); `replay_doc` there says what
each value means. `native.columns` makes the four int64 columns; `replay._run_native` reads the result."""

from array import array
from typing import Callable

# (request_index, size, rounded, alloc_size, stream, reserved, allocated, device_free, cap|None,
#  largest_free_block): `OOMInfo`'s fields in order
OOMTuple = tuple[int, int, int, int, int, int, int, int, int | None, int]
ReplayResult = tuple[
    int,  # requests done
    tuple[int, ...],  # the counters of `Stats.__slots__`, in that order
    list[tuple[int, int, int, int, int]] | None,  # (action index into native.ACTIONS, addr, size, stream, request)
    OOMTuple | None,  # the last failed allocation
    list[int],  # expected failures (request indices)
    list[OOMTuple],  # the state at each of them
    list[int],  # surprises: recorded failures that fit
    list[int],  # adapted: served by a fallback size
    list[int],  # t_index
    list[int],  # t_alloc
]

def replay(
    ops: array[int],
    sizes: array[int],
    rids: array[int],
    streams: array[int],
    fallbacks: dict[int, tuple[int, ...]],
    settings: tuple[int | None, float, int | None, int, int, bool, tuple[int, ...] | None, bool],
    device: tuple[int, int],
    callbacks: tuple[Callable[[int], int], Callable[[int, int], None], Callable[[int], int], Callable[[int, int], None]],
    flags: tuple[bool, bool, int],
    /,
) -> ReplayResult: ...
