"""Types of the native replay core (`_native.c`, built by setup.py); `session_doc` there says what
each value means. `native.columns` makes the four int64 columns; `session.native_session` opens
a `Session` and `session.native_output` reads its result."""

from array import array
from typing import Any, Callable

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
# ("py", alloc, free) | ("va", top, small_region) | ("recorded", int64 (size, addr) pairs, top, small_region)
AddressSpec = tuple[str, Callable[[int], int], Callable[[int, int], None]] | tuple[Any, ...]

class Session:
    """A paused replay (`session()`)."""

    @property
    def pos(self) -> int: ...
    @property
    def failed(self) -> bool: ...
    @property
    def reserved(self) -> int: ...
    @property
    def cloneable(self) -> bool: ...
    @property
    def vmax(self) -> int: ...
    @property
    def diverged(self) -> bool: ...
    @property
    def address_divergence(self) -> int | None: ...
    def run(self, stop: int, /) -> None: ...
    def empty_cache(self) -> None: ...
    def set_cap(self, cap: int | None, /) -> None: ...
    def clone(self, events: bool = True, fallbacks: dict[int, tuple[int, ...]] | None = None) -> Session: ...
    def result(self) -> ReplayResult: ...

def session(
    ops: array[int] | memoryview,
    sizes: array[int] | memoryview,
    rids: array[int] | memoryview,
    streams: array[int] | memoryview,
    fallbacks: dict[int, tuple[int, ...]],
    settings: tuple[int | None, float, int | None, int, int, bool, tuple[int, ...] | None, bool],
    device: tuple[int, int],
    addresses: tuple[AddressSpec, AddressSpec],
    flags: tuple[bool, bool, int],
    /,
) -> Session: ...
def int64(values: list[int], /) -> bytes | None: ...
def splice(
    columns: tuple[list[int], list[int], list[int], list[int], list[int]],
    ids: list[int] | None,
    keys: list[int],
    before: dict[int, Any],
    changed: dict[int, Any],
    given_stacks: bool,
    int64_columns: tuple[Any, Any, Any, Any] | None = None,
    /,
) -> tuple[
    tuple[list[int], list[int], list[int], list[int], list[int]],
    list[int] | None,
    bytearray,
    list[int],
    tuple[bytes, bytes, bytes, bytes] | None,
]: ...
