"""Holds the `sitecustomize.py` that `alloctune record` puts on a child's PYTHONPATH.

A package only so that installers ship the bootstrap file; nothing here is imported by
alloctune itself (the directory, not the package, goes on PYTHONPATH).
"""
