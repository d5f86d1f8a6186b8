"""The allocator's memory map at any point of a recording: segments, blocks, who holds them.

One function per source computes it (`build.py`): a snapshot's own `segments`, a pass over its
history, or the exact simulator after any request of a loaded trace; its plain data is
`model.py`'s. `diagnose --snapshot`, `explain` and the report all read it, so it sits below them.
Importing this package imports nothing else.
"""
