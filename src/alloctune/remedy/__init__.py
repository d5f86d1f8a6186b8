"""Remedies: what a program can change besides its allocator setting, and what each change buys.

A remedy is one thing everywhere: a rewrite of the recording (or, where no rewrite is exact, a run
of the program with the change) plus its min budget from `sim.sweep`, its code line and its method
-- simulated, measured, or needing a confirming run (`model.py`: the `Remedy` record, `rewritten`,
`simulated`). The remedies themselves: release points and a site's kept blocks freed where a
repetition ends (`release.py`), the real `guard.Janitor` driven by the simulated allocator
(`janitor.py`), cuBLAS / cuDNN workspace caps (`workspaces.py`), activation checkpointing,
optimizer state and the leak (`training.py`), and the measured forms from agent-applied runs with the
requests for those runs (`measured.py`). `registry.py` gathers every remedy one recording answers,
the one list `explain`, `tune` and the report read.

They read the recording through `alloctune.analysis` (repetitions, sites, phases); `explain` and
`tune` sit above. Importing this package imports nothing else (no torch, ever).
"""
