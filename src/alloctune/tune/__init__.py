"""Tuning the allocator setting for one workload: candidates, the sweep, the store, the answer.

Pure Python over plain data (no torch): the GPU trials come from an `Evaluator`, which in
the CLI is `alloctune.runner.run_trial` and in tests a fake.
"""
