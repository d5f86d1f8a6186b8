"""The one GPU driver: run named jobs on the device, each with its own time limit, outputs packed.

    python bench/gpu.py --list                       # every job, one line each
    python bench/gpu.py JOB[:SECONDS] ...            # one after another (wall times mean what they say)
    python bench/gpu.py --parallel JOB[:SECONDS] ... # side by side (memory results are per-process caps)
    python bench/gpu.py --dry-run JOB ...            # print each job's shell commands, run nothing

Each job is a file `bench/jobs/NAME.sh`: its description, `# limit: N s` (the default time limit),
then the bash it runs in the repository root after `jobs/_prelude.sh` (the repo's `src` on
PYTHONPATH, unbuffered output, `$TORCHRUN`, the helpers `tune_ranks` and `tune_train`), with `OUT`
set to its own folder `$ROOT/JOB` (ROOT: `--out` or `$OUT`, default /tmp/gpu-out) and the native
simulator core built once. Its output goes to `$OUT/log.txt` and the last lines to the terminal.
After every job everything is packed into `ROOT/gpu-results.tar.gz`, so a device call cut short
still brings back what finished, and one line per job (name, rc, seconds, exact command) is
appended to `ROOT/jobs.tsv`. Raw device output never goes into git: copy what a doc needs into
`bench/results/` as a summary.

Jobs take their parameters from the environment (`JOBS=3 TRIAL_TIMEOUT=300 python bench/gpu.py
tune-real`); each job's text (`--dry-run`) says which. The numbered batches older result pages name are
listed as jobs in bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS_DIR = REPO / "bench" / "jobs"  # one file per job: NAME.sh


@dataclass(frozen=True)
class Job:
    doc: str
    script: str
    seconds: int = 240  # the default time limit


def read_job(path: Path) -> Job:
    """A job file: `# ` lines of its description, `# limit: N s`, then the bash it runs."""
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("# limit: "))
    doc = " ".join(line[2:].strip() for line in lines[:at])
    return Job(doc, "\n" + "".join(lines[at + 1:]), int(lines[at].split()[2]))


# Defined for every job (jobs/_prelude.sh): the environment, `$TORCHRUN`, `tune_ranks` and `tune_train`.
PRELUDE = "\n" + "".join((JOBS_DIR / "_prelude.sh").read_text().splitlines(keepends=True)[1:])
JOBS: dict[str, Job] = {p.stem: read_job(p) for p in sorted(JOBS_DIR.glob("*.sh")) if not p.stem.startswith("_")}


def parse_spec(spec: str) -> tuple[str, int]:
    name, _, secs = spec.partition(":")
    if name not in JOBS:
        raise SystemExit(f"gpu.py: error: unknown job {name!r}; known: {', '.join(sorted(JOBS))}")
    try:
        return name, int(secs) if secs else JOBS[name].seconds
    except ValueError:
        raise SystemExit(f"gpu.py: error: {spec!r}: the time limit must be whole seconds") from None


def script_of(name: str, out: Path) -> str:
    return PRELUDE + f'export OUT={shlex.quote(str(out / name))}\nmkdir -p "$OUT"\n' + JOBS[name].script


def start(name: str, secs: int, out: Path) -> subprocess.Popen:
    log = open(out / name / "log.txt", "wb")
    cmd = ["timeout", "-k", "10", str(secs), "bash", "-c", script_of(name, out)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def finish(name: str, proc: subprocess.Popen, t0: float, out: Path, spec: str) -> None:
    rc = proc.wait()
    wall = time.monotonic() - t0
    print(f"== {name} rc={rc} {wall:.0f}s", flush=True)
    lines = (out / name / "log.txt").read_text(errors="replace").splitlines()
    print("\n".join(lines[-25:]), flush=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(out / "jobs.tsv", "a") as fh:
        fh.write(f"{stamp}\t{name}\trc={rc}\t{wall:.0f}s\tpython bench/gpu.py {spec}\n")
    pack(out)


def pack(out: Path) -> None:
    tmp = out / "gpu-results.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(out.iterdir()):
            if not p.name.startswith("gpu-results.tar.gz"):
                tar.add(p, arcname=p.name)
    tmp.replace(out / "gpu-results.tar.gz")


def environment(out: Path) -> None:
    probe = ("date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; "
             "python3 -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available())'; "
             "python3 setup.py build_ext --inplace -q >/dev/null 2>&1 "
             "|| echo 'native core not built: the Python simulator is used'")
    text = subprocess.run(["bash", "-c", probe], cwd=REPO, capture_output=True, text=True).stdout
    (out / "env.txt").write_text(text)
    print(text, end="", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jobs", nargs="*", metavar="JOB[:SECONDS]")
    ap.add_argument("--list", action="store_true", help="print every job and its default time limit")
    ap.add_argument("--parallel", action="store_true", help="run the jobs side by side, not one after another")
    ap.add_argument("--dry-run", action="store_true", help="print each job's shell commands, run nothing")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/gpu-out", help="where outputs go (default $OUT)")
    a = ap.parse_args(argv)
    if a.list or not a.jobs:
        width = max(map(len, JOBS))
        print(f"{'job':{width}}  limit  what")
        for name, job in JOBS.items():
            print(f"{name:{width}}  {job.seconds:4d}s  {job.doc}")
        return 0
    specs = [(s, *parse_spec(s)) for s in a.jobs]
    out = Path(a.out).resolve()
    if a.dry_run:
        for _, name, secs in specs:
            print(f"# ---- {name} (limit {secs} s)\n{script_of(name, out)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for _, name, _ in specs:
        (out / name).mkdir(parents=True, exist_ok=True)
    environment(out)
    if a.parallel:
        running = [(spec, name, start(name, secs, out), time.monotonic()) for spec, name, secs in specs]
        for spec, name, proc, t0 in running:
            finish(name, proc, t0, out, spec)
    else:
        for spec, name, secs in specs:
            t0 = time.monotonic()
            finish(name, start(name, secs, out), t0, out, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
