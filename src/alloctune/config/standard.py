"""The standard settings to compare: the usual fixes for fragmentation, as whole setting strings.

What the demo compares, what `tune` starts from, and what a snapshot diagnosis replays ("what
if") when the caller names none -- one list for all of them. GC appears with a max_split_size
because it only acts on a capped process and mostly on split-protected blocks.
"""

from __future__ import annotations

STANDARD_CONFS: tuple[str, ...] = (
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "garbage_collection_threshold:0.6,max_split_size_mb:256",
    "roundup_power2_divisions:4",
)

DEFAULT_LABEL = "(default)"  # the unset setting, as every table and sentence names it


def setting_label(conf: str) -> str:
    """A setting string as a row label: itself, or `DEFAULT_LABEL` for the unset one (empty)."""
    return conf or DEFAULT_LABEL
