"""bench/ as a suite (issue 38): sizes a reader can hold, no copied code, every GPU job and every named path runnable.

Read from the files (nothing is imported or run): the Python lines under bench/ in all and per file, runs of
lines two files share, the scripts the job files of bench/gpu.py run, and the bench paths that tests, src and
docs name. bench/README.md says which file measures what and where each figure regenerates from.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
MAX_BENCH_LINES = 5000  # issue 38's limit for all Python under bench/
MAX_FILE_LINES = 400
SHARED_RUN = 6  # lines in a row that two files may not share (after blanks, comments and imports are dropped)
# The jobs of `python bench/gpu.py --list`: each must stay runnable. Jobs of finished experiments leave with their
# script (RETIRED_JOBS), and bench/README.md names the commit that last held them.
JOBS = {"bisections", "config", "demo", "diagnose", "diagnose-cap", "empty-cache", "fallible-calib", "monitor",
        "nograd-truth", "plan", "pytest-gpu", "ranks-tune", "recordings", "remedies", "roundup-check", "simulate",
        "throughput-measure", "trace", "train", "train-confirm", "train-tune", "truth", "tune", "tune-real", "tune-sharp",
        "workloads"}
RETIRED_JOBS = {"driver-cost", "guard", "hostile", "plan-confirm", "plan-points", "plan-sharp", "record-stacks", "scale"}


def python_files(folder: Path | None = None) -> dict[str, int]:
    """bench-relative path -> line count, for every Python file under `folder` (bench/)."""
    folder = folder or BENCH
    return {p.relative_to(folder).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(folder.rglob("*.py")) if "__pycache__" not in p.parts}


def shared_runs(files: dict[str, list[str]], run: int = SHARED_RUN) -> set[tuple[str, str]]:
    """Pairs of files that share `run` code lines in a row, the same to the letter once white space is folded."""
    seen: dict[tuple[str, ...], str] = {}
    pairs = set()
    for name, lines in files.items():
        code = [" ".join(x.split()) for x in lines]
        code = [x for x in code if x and not x.startswith(("#", "import ", "from ")) and x not in (")", "]", "}")]
        for i in range(len(code) - run + 1):
            key = tuple(code[i:i + run])
            first = seen.setdefault(key, name)
            if first != name:
                pairs.add(tuple(sorted((first, name))))
    return pairs


def job_files() -> dict[str, str]:
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted((BENCH / "jobs").glob("*.sh"))
            if not p.stem.startswith("_")}


def test_the_walks_see_the_suite():
    """Guard against walks that find nothing (and so pass everything)."""
    assert len(python_files()) > 20 and "gpu.py" in python_files()
    assert len(job_files()) >= len(JOBS)


def test_bench_stays_under_its_line_limit():
    total = sum(python_files().values())
    assert total <= MAX_BENCH_LINES, f"bench/ holds {total} lines of Python, over {MAX_BENCH_LINES}: merge or retire"


def test_no_bench_file_over_the_limit():
    over = {name: n for name, n in python_files().items() if n > MAX_FILE_LINES}
    assert over == {}, f"bench files over {MAX_FILE_LINES} lines (one experiment per file, shared code in suite.py): {over}"


def test_no_two_bench_files_share_a_run_of_code():
    files = {p.name: p.read_text(encoding="utf-8").splitlines()
             for p in sorted(BENCH.rglob("*")) if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts}
    assert shared_runs(files) == set(), "copied code: move it into bench/suite.py (or runlog.py) and call it"


def test_duplicates_pairs_no_two_bench_files():
    """The `duplicates` tool, where installed, also sees runs alike but for names and values."""
    if shutil.which("duplicates") is None:
        pytest.skip("the `duplicates` tool is not installed here")
    out = subprocess.run(["duplicates", "--repo", str(BENCH), "--most", "200", "--seconds", "60"], capture_output=True,
                         text=True, timeout=120).stdout
    if "incomplete:" in out:
        pytest.skip(f"duplicates did not finish: {out.splitlines()[-1]}")
    rows = re.findall(r"^D\d+ (\S+?):\S+ ~ (\S+?):\S+", out, re.M)
    assert [r for r in rows if r[0] != r[1]] == [], out


def test_every_job_is_there_and_runs_scripts_that_exist():
    jobs = job_files()
    assert JOBS - set(jobs) == set(), "a job of bench/gpu.py is gone: keep its name runnable"
    assert set(jobs) - JOBS == set(), "a new job: add its name to JOBS"
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    assert RETIRED_JOBS & set(jobs) == set() and all(f"`{j}`" in readme for j in RETIRED_JOBS)
    for name, text in jobs.items():
        assert re.search(r"^# limit: \d+ s$", text, re.M), f"jobs/{name}.sh: no '# limit: N s' line"
        missing = [s for s in re.findall(r"\bbench/([\w./-]+\.py)\b", text) if not (BENCH / s).is_file()]
        assert missing == [], f"jobs/{name}.sh runs scripts that are gone: {missing}"


def test_bench_paths_named_outside_bench_exist():
    """Tests, src, docs and recorded data name bench scripts by path; each must still be there."""
    named: dict[str, str] = {}
    roots = [ROOT / "tests", ROOT / "src" / "alloctune", ROOT / "docs", ROOT / "README.md"]
    for root in roots:
        for p in [root] if root.is_file() else sorted(root.rglob("*")):
            if p.suffix in (".py", ".md", ".json", ".txt", ".sh") and p.is_file():
                for s in re.findall(r"\bbench/([A-Za-z0-9_]+\.py)\b", p.read_text(encoding="utf-8", errors="replace")):
                    named.setdefault(s, p.relative_to(ROOT).as_posix())
    assert len(named) > 10
    missing = {s: where for s, where in named.items() if not (BENCH / s).is_file()}
    assert missing == {}, f"bench scripts named elsewhere but gone (keep the path, or change the reference): {missing}"


def test_the_rules_can_fail(tmp_path, monkeypatch):
    """The walks see a long file and a copied run when there is one (so the rules can fail)."""
    body = [f"x{i} = compute({i}, 'n')" for i in range(SHARED_RUN)]
    assert shared_runs({"a.py": ["import os", *body], "b.py": ["y = 1", *body, "z = 2"]}) == {("a.py", "b.py")}
    assert shared_runs({"a.py": body[:-1], "b.py": body[:-1]}) == set()
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "short.py").write_text("x = 1\n")
    assert python_files(tmp_path) == {"long.py": MAX_FILE_LINES + 1, "sub/short.py": 1}
    monkeypatch.setattr(sys.modules[__name__], "BENCH", tmp_path)
    assert sum(python_files().values()) == MAX_FILE_LINES + 2
