"""`alloctune demo`'s core: what alloctune tells an RVC user, from a real trace, on any CPU (`core.py`).

Beside the command (`cli/demo_cmd.py` parses and calls it, `cli/demo_view.py` renders what it
returns); it only drives the simulator and the shipped traces, so it sits with the other
consumers of `sim`.
"""
