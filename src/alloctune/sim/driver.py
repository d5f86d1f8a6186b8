"""The CUDA driver as the allocator sees it: how much device memory is left, and where a new
segment lands in the address space.

Addresses matter for exact replay on torch <= 2.11 because equal-size free blocks are
ordered by address (lowest wins). They are the driver's choice, not the allocator's, and
what the H200 traces show is only partly predictable: segments of more than 2 MiB land
top-down in 32 MiB-aligned slots, 2 MiB segments fill the slack above recent big ones,
freed ranges are handed out again, and some ranges are taken by allocations the trace never
sees (CUDA context, libraries), so the first segments can land anywhere. What does carry
over is the *layout by position*: replaying the same program under another setting, the
k-th segment lands where the recording's k-th did (a 22 MiB and a 24 MiB segment take the
same 32 MiB slot). Hence two models:

* `RecordedAddresses` places the k-th segment at the recording's k-th address while that
  range is free (exact for the recorded setting; all 18 uncapped cross-setting replays of
  the shared traces are exact with `default`'s addresses);
* `DriverVA` predicts without a recording (a simple top-down heap that reuses freed
  ranges; 30 of the 33 shared runs replay exactly with it).

Both models have native twins in the replay core (`_native.c`), rule for rule; a model hands
its twin over with `native_spec()` while it has placed nothing yet (the Python classes stay the
specification, and any other address model is called back from the core).

Device memory: cudaMalloc(n) / cuMemCreate succeed iff n fits in
`total_memory - overhead - bytes held`, where `overhead` is the CUDA context and other
processes (not visible in an allocator trace; from a recorded `oom.device_free` or a guess).
"""

from __future__ import annotations

from array import array
from typing import Iterable, Protocol, Union

from sortedcontainers import SortedList

from alloctune.units import MiB

H200_TOTAL = 150_109_880_320  # cudaMemGetInfo total of the H200 the shared traces come from
DEFAULT_OVERHEAD = 518 * MiB  # CUDA context of torch 2.11 / CUDA 13 on that H200 (spec §11.1)
_TOP = 0x7F0000000000  # where simulated address spaces start (CUDA's VA lives near 2**47)


class AddressModel(Protocol):
    def alloc(self, size: int) -> int: ...
    def free(self, addr: int, size: int) -> None: ...


# What the native core's twin of a model starts from: ("va", top, small_region) for a fresh
# `DriverVA`, ("recorded", int64 (size, addr) pairs, fallback top, fallback small_region) for a
# fresh `RecordedAddresses` (its fallback a fresh `DriverVA`).
NativeSpec = Union[tuple[str, int, int], tuple[str, "array[int]", int, int]]


class DriverVA:
    """Predicts segment addresses without a recording: a top-down heap that reuses freed ranges.

    As on the H200: successive cudaMalloc calls return decreasing addresses, the range of a
    freed segment is reused by the next segment that fits (best fit by hole size, at the
    hole's low end), and 2 MiB segments pack upwards next to each other in their own region.
    Only the *relative order* of addresses matters to the allocator, and only between
    equal-size free blocks, so raw numbers need not match. (A finer model with 32 MiB-aligned
    slots orders recorded address pairs better but replayed no more traces exactly.)
    """

    def __init__(self, top: int = _TOP, small_region: int = 1 << 40) -> None:
        self._top, self._small_region = top, small_region
        self._low = top  # next fresh large range ends here (grows downward)
        self._small_next = top - small_region  # small segments pack upwards from here
        self._holes: SortedList = SortedList()  # (size, addr) of freed large ranges
        self._small_holes: SortedList = SortedList()  # addrs of freed 2 MiB ranges

    def alloc(self, size: int) -> int:
        addr: int  # SortedList has no types: what its pop() returns is declared here
        haddr: int
        if size == 2 * MiB:
            if self._small_holes:
                addr = self._small_holes.pop(0)
                return addr
            addr = self._small_next
            self._small_next += size
            return addr
        i = self._holes.bisect_left((size, -1))
        if i < len(self._holes):
            hsize, haddr = self._holes.pop(i)
            if hsize > size:
                self._holes.add((hsize - size, haddr + size))
            return haddr
        self._low -= size
        return self._low

    def free(self, addr: int, size: int) -> None:
        if size == 2 * MiB:
            self._small_holes.add(addr)
            return
        # merge with adjacent holes so a freed neighbourhood can host a bigger segment later
        start, end = addr, addr + size
        for hsize, haddr in list(self._holes):
            if haddr + hsize == start or haddr == end:
                self._holes.remove((hsize, haddr))
                start, end = min(start, haddr), max(end, haddr + hsize)
        self._holes.add((end - start, start))

    def native_spec(self) -> tuple[str, int, int] | None:
        """The native twin's start, while this model has placed nothing (else None: its state
        stays here)."""
        # a subclass may place segments otherwise: only this class itself has the twin
        fresh = (
            type(self) is DriverVA
            and not self._holes
            and not self._small_holes
            and self._low == self._top
            and self._small_next == self._top - self._small_region
        )
        return ("va", self._top, self._small_region) if fresh else None


class RecordedAddresses:
    """Hands out the addresses a recording got: the k-th segment goes where the recording's
    k-th `segment_alloc` went.

    When the simulation makes the same segments as the recording (same setting) this is the
    recording exactly. Under another setting the sequences drift apart, but the driver's
    layout depends on the order of requests much more than on their exact sizes (a 22 MiB
    and a 24 MiB segment both take a 32 MiB-aligned slot on the H200), so the recorded
    position stays the best guess while it fits: an address whose range would overlap a
    live segment is not used, and the `fallback` model places that segment instead.
    `diverged_at` is the first allocation whose size differs from the recording's (None
    while they agree); `fallbacks` counts the segments the model placed.
    """

    def __init__(self, recorded: Iterable[tuple[int, int]], fallback: AddressModel | None = None) -> None:
        self._recorded = list(recorded)
        self._count = 0
        self._fallback = fallback or DriverVA(top=0x3F0000000000)
        self._live: dict[int, int] = {}  # addr -> size of segments placed at recorded addresses
        self.diverged_at: int | None = None
        self.fallbacks = 0

    def alloc(self, size: int) -> int:
        k = self._count
        self._count += 1
        if k < len(self._recorded):
            rsize, addr = self._recorded[k]
            if self.diverged_at is None and rsize != size:
                self.diverged_at = k
            if not self._overlaps(addr, size):
                self._live[addr] = size
                return addr
        elif self.diverged_at is None:
            self.diverged_at = k
        self.fallbacks += 1
        return self._fallback.alloc(size)

    @property
    def asked(self) -> int:
        """Segments this object was asked to place (0 when its native twin placed them)."""
        return self._count

    def _overlaps(self, addr: int, size: int) -> bool:
        end = addr + size
        return any(a < end and addr < a + s for a, s in self._live.items())

    def free(self, addr: int, size: int) -> None:
        if self._live.pop(addr, None) is None:
            self._fallback.free(addr, size)

    def native_spec(self) -> NativeSpec | None:
        """The native twin's start, while this model has placed nothing and falls back to a
        `DriverVA` (else None: it is called back); a subclass has no twin."""
        fallback = self._fallback.native_spec() if isinstance(self._fallback, DriverVA) else None
        if type(self) is not RecordedAddresses or self._count or fallback is None:
            return None
        try:
            pairs = array("q", [v for pair in self._recorded for v in pair])
        except OverflowError:  # an address beyond int64: the Python model places them
            return None
        return ("recorded", pairs, fallback[1], fallback[2])


class Device:
    """Device memory and the driver's address choices for one simulated GPU."""

    def __init__(
        self,
        total_memory: int = H200_TOTAL,
        overhead: int = DEFAULT_OVERHEAD,
        addresses: AddressModel | None = None,
        va_addresses: AddressModel | None = None,
    ) -> None:
        self.total_memory = int(total_memory)
        self.overhead = int(overhead)
        self.usable = self.total_memory - self.overhead
        self.used = 0
        self.addresses = addresses or DriverVA()
        # virtual ranges reserved for expandable segments (cuMemAddressReserve)
        self.va = va_addresses or DriverVA(top=0x7E0000000000)

    @property
    def free_bytes(self) -> int:
        """What cudaMemGetInfo would report as free."""
        return self.total_memory - self.overhead - self.used

    def malloc(self, size: int) -> int | None:
        """cudaMalloc: an address, or None for cudaErrorMemoryAllocation."""
        if self.used + size > self.usable:
            return None
        self.used += size
        return self.addresses.alloc(size)

    def free(self, addr: int, size: int) -> None:
        self.used -= size
        self.addresses.free(addr, size)

    def create(self, size: int) -> bool:
        """cuMemCreate of physical pages for an expandable segment."""
        if self.used + size > self.usable:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size
