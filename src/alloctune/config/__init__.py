"""The allocator setting (`PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`) as plain data.

Pure Python (no torch): parse and validate a setting string with the grammar and limits of a
given torch release, format it canonically, list every knob, and point out knobs that will
silently do nothing.
"""

from alloctune.config.knobs import KNOBS, Knob, knobs_for
from alloctune.config.model import (
    AllocatorConfig,
    apply_roundup,
    parse_config,
    parse_detailed,
    roundup_table_of,
    setting_from_table,
)
from alloctune.config.parse import ConfigSyntaxError, tokenize
from alloctune.config.versions import TorchVersion, parse_torch_version

__all__ = [
    "KNOBS",
    "AllocatorConfig",
    "ConfigSyntaxError",
    "Knob",
    "TorchVersion",
    "apply_roundup",
    "knobs_for",
    "parse_config",
    "parse_detailed",
    "parse_torch_version",
    "roundup_table_of",
    "setting_from_table",
    "tokenize",
]
