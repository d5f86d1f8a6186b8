"""A recording analysed as a whole: what every allocation is, independent of any moment.

Its lifetime, the repetition it was made in (`repeats.py`), its site -- the user's line, the
model's own code, the library frame (`sites.py`) -- its phase of a training step (`phases.py`),
and whether its site keeps blocks and grows (`core.py`: `analyse` -> `Analysis`). `explain`
splits the memory at a moment by it and the remedies (`alloctune.remedy`) rewrite the
recording by it, so it sits below both. Pure Python over the request stream: no torch.
"""
