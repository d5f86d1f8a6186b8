"""Weight-free reference workloads that reproduce real GPU memory patterns.

Each workload builds a model with random weights but the real layer shapes and allocation
order, so PyTorch's caching allocator sees what it sees in production: ``rvc`` (RVC voice
conversion inference), ``diffusion`` (SD-1.5-shaped UNet + VAE decoder at mixed
resolutions), ``llm`` (Llama-shaped ``generate`` with a growing KV cache) and ``train``
(a GPT-like model trained with AdamW on variable shapes).

Run one with ``python -m alloctune.workloads.NAME [--device cuda|cpu] [--tiny] ...``.
This package imports torch only inside the workload modules, so listing the names here
stays cheap.
"""

from __future__ import annotations

WORKLOADS: tuple[str, ...] = ("rvc", "diffusion", "llm", "train")

__all__ = ["WORKLOADS"]
