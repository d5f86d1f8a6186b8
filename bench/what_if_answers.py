"""Dump the snapshot what-if answers for every shared capped recording, to diff two revisions.

Why: #20.2 moved the what-ifs onto `alloctune.sim.sweep`; this is how "same outputs" was checked
(run it on both revisions, `cmp` the two JSON files). CPU only, about a minute.

    PYTHONPATH=src python bench/what_if_answers.py /tmp/after.json [../shared/traces]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from alloctune.diagnose.snapshot import diagnose_snapshot

CANDIDATES = ["", "expandable_segments:True", "max_split_size_mb:512", "backend:cudaMallocAsync",
              "garbage_collection_threshold:0.6", "max_split_size_mb:128"]


def main(out: str, root: str = "../shared/traces") -> None:
    answers: dict[str, object] = {}
    for f in sorted(Path(root).glob("*/*cap*.pickle.xz")):
        t = time.time()
        try:
            d = diagnose_snapshot(f, candidates=CANDIDATES)
            answers[str(f)] = [w.to_dict() for w in d.what_if] + [d.recommendation]
        except Exception as exc:  # a snapshot without an OOM entry is an answer too
            answers[str(f)] = f"{type(exc).__name__}: {exc}"
        print(f"{f} {time.time() - t:.1f} s", file=sys.stderr)
    Path(out).write_text(json.dumps(answers, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(*sys.argv[1:])
