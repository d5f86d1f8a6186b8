"""Docs that run: every `alloctune ...` example in README.md and docs/usage/*.md that needs no GPU is run.

Why: examples drift (an option renamed, a default changed, a file name that never existed), and a
newcomer's first hour is spent on them. Like nvitop's docstring examples, ours are executed: each
command is taken from the code blocks as printed, its documented placeholders are replaced from
`PLACEHOLDERS` (one table, below), and it runs through a shell in a temporary directory (one per
document, so a later example can read what an earlier one wrote: `> sim.json`, `--what-if-dir wi/`).
It must exit 0 -- or 2 where the doc prints `alloctune: error:` as its output -- and never print a
traceback.

What counts as an example: in a `bash`/`sh`/`shell` block, a line starting with `alloctune` (or
`$ alloctune`); in any other block (`console`, plain), only a `$ alloctune` line -- the rest is
output. A trailing `\\` joins the next line; a trailing `# comment` is dropped.

Not run (counted, listed by `test_the_skips_are_few_and_named`):
* GPU work: `run`, `tune`, `record`, `watch`, `guard`, `--gpu`, `plan --confirm` (it runs the program);
* an example whose input only a GPU run makes (`INPUTS_FROM_GPU`, e.g. the store `tune` writes);
* a block right after the comment `<!-- docs-run: skip (why) -->` in the document.

README.md is edited by hand elsewhere: an example of it that does not run is listed in
`README_DRIFT` with the fix it needs, and must be removed from there once fixed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DOCS = [REPO / "README.md", *sorted((REPO / "docs" / "usage").glob("*.md"))]
BIN = Path(sys.executable).parent

TRACES = SHARED / "traces"
DATA = REPO / "tests" / "data"

# The one table: a placeholder word of the docs -> what it stands for here (`{tmp}`: the document's
# temporary directory, prepared by `_prepare`). Words are replaced whole, never inside another word.
PLACEHOLDERS: dict[str, str] = {
    "run.pickle": f"{TRACES}/rvc_ec1/default.pickle.xz",          # "your recording" (no stacks)
    "run.pickle.xz": f"{TRACES}/rvc_ec1/default.pickle.xz",
    "default.pickle.xz": f"{TRACES}/rvc_ec1/default.pickle.xz",   # a run under the unset setting...
    "max_split_128.pickle.xz": f"{TRACES}/rvc_ec1/max_split_128.pickle.xz",  # ...and one under another
    "train.log": "{tmp}/train.log",                                  # a log with an OOM message
    "err.txt": "{tmp}/err.txt",
    "oom-snapshot.1234.pickle": f"{DATA}/cap_oom/convnext.pickle.xz",  # a snapshot written at an OOM
    "oom-snapshot.12345.pickle": f"{DATA}/cap_oom/convnext.pickle.xz",
    "leak.pickle": f"{DATA}/explain_gpu/convnext_leak.pickle.xz",  # a program that keeps memory...
    "fixed.pickle": f"{DATA}/explain_gpu/convnext_clean.pickle.xz",  # ...and its fixed twin
    "train.pickle": f"{DATA}/explain_gpu/train_leak.pickle.xz",    # a training loop, with stacks
    "job.rank0.pickle": f"{TRACES}/rvc_ec0/default.pickle.xz",     # two recordings of one job
    "job.rank1.pickle": f"{TRACES}/rvc_ec1/default.pickle.xz",
    "runs/*.pickle.xz": f"{TRACES}/rvc_ec1/default.pickle.xz {TRACES}/rvc_ec1/expandable.pickle.xz",
    "rvc-*.pickle.xz": f"{DATA}/size_recordings/size_rvc_*.pickle.xz",  # `record --size` output
    "recordings/": "{tmp}/recordings/",                              # a directory of it (RVC, 10..60 s)
    "rec/": "{tmp}/rec/",                                            # another (HuBERT, 8/16/24 s)...
    "cal-88.pickle.xz:88": f"{DATA}/size_recordings/cal_hubert_16_mid.pickle.xz:16",  # ...and a capped run
    "a.pickle:1024": f"{DATA}/plan_sharp/size_timm_256.pickle.xz:256",  # torch's own snapshots at sizes
    "b.pickle:2048": f"{DATA}/plan_sharp/size_timm_384.pickle.xz:384",
    "c.pickle:4096": f"{DATA}/plan_sharp/size_timm_512.pickle.xz:512",
    '"..."': '"expandable_segments:True"',                           # any setting string
    "../shared/": f"{SHARED}/",                                      # paths relative to the repository
    "tests/data/": f"{DATA}/",
}
PREFIXES = ("../shared/", "tests/data/")  # replaced at the start of a word, the rest of the path kept

GPU_COMMANDS = {"run", "tune", "record", "watch", "guard"}
GPU_OPTIONS = {"--gpu", "--confirm"}
INPUTS_FROM_GPU = {"sweep.jsonl": "the store `alloctune tune` writes"}

# README.md examples that do not run as printed (the command as printed -> the fix it needs); README
# is edited elsewhere. Keyed by the command, not its line: the README moves under other edits.
README_DRIFT: dict[str, str] = {}

SKIP_MARK = re.compile(r"<!--\s*docs-run:\s*skip\b")
TIME_LIMIT_S = 60


@dataclass(frozen=True)
class Example:
    """One command of a document.

    Attributes:
        doc: the document's path relative to the repository.
        line: 1-based line of the command in it.
        command: the command as printed (joined continuation lines, without `$ ` and the comment).
        exit_code: what it must exit with: 2 where the doc shows `alloctune: error:` after it, else 0.
        skip: why it is not run ("" when it is).
    """

    doc: str
    line: int
    command: str
    exit_code: int = 0
    skip: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _strip_comment(line: str) -> str:
    """`line` without a trailing shell comment (a `#` after a space, outside quotes)."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _skip_reason(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    sub = next((w for w in words[1:] if not w.startswith("-")), "")
    if sub in GPU_COMMANDS:
        return f"GPU: alloctune {sub}"
    gpu = sorted(GPU_OPTIONS & {w.split("=")[0] for w in words})
    if gpu:
        return f"GPU: {gpu[0]}"
    made = [w for w in words if w in INPUTS_FROM_GPU]
    if made:
        return f"{made[0]} is {INPUTS_FROM_GPU[made[0]]}"
    return ""


def extract(path: Path) -> list[Example]:
    """The examples of one document, in order."""
    doc = str(path.relative_to(REPO))
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", lines[i])
        if not fence:
            i += 1
            continue
        before = next((x for x in reversed(lines[:i]) if x.strip()), "")
        marked = SKIP_MARK.search(before)
        lang, end_fence = fence.group(2).lower(), fence.group(1)
        shell = lang in ("bash", "sh", "shell")
        j = i + 1
        current: list[Example] = []
        while j < len(lines) and not lines[j].strip().startswith(end_fence):
            text = lines[j].strip()
            start = j
            if text.startswith("$ ") or (shell and text.startswith("alloctune ")):
                cmd = text.removeprefix("$ ")
                while cmd.endswith("\\") and j + 1 < len(lines):
                    j += 1
                    cmd = cmd[:-1].rstrip() + " " + lines[j].strip()
                cmd = _strip_comment(cmd)
                if cmd.startswith("alloctune "):
                    reason = "marked <!-- docs-run: skip -->" if marked else _skip_reason(cmd)
                    current.append(Example(doc, start + 1, cmd, skip=reason))
                else:
                    current.append(Example(doc, start + 1, cmd, skip="not an alloctune command"))
            elif current and text.startswith("alloctune: error:") and not shell:
                last = current[-1]
                current[-1] = Example(last.doc, last.line, last.command, 2, last.skip)
            j += 1
        out.extend(e for e in current if e.skip != "not an alloctune command")
        i = j + 1
    return out


def substitute(command: str, tmp: Path) -> str:
    """`command` with every placeholder word replaced (`PLACEHOLDERS`) and `alloctune` from this venv."""
    out = command
    for word, value in sorted(PLACEHOLDERS.items(), key=lambda kv: -len(kv[0])):
        value = value.replace("{tmp}", str(tmp))
        if word in PREFIXES:
            out = re.sub(rf"(?<![\w./-]){re.escape(word)}", lambda _m, v=value: v, out)
        else:
            out = re.sub(rf"(?<![\w./-]){re.escape(word)}(?![\w.-])", lambda _m, v=value: v, out)
    return f"{shlex.quote(str(BIN / 'alloctune'))}{out[len('alloctune'):]}"


def _prepare(tmp: Path, corpus: list[str]) -> None:
    """The files the placeholders name inside a document's directory: logs from the shared corpus,
    and two directories of recordings made at several input sizes (with their sidecars)."""
    (tmp / "train.log").write_text("\n".join(corpus[:3]) + "\n", encoding="utf-8")
    windows = next((t for t in corpus if "C:\\" in t or "Windows" in t), corpus[0])
    (tmp / "err.txt").write_text(windows + "\n", encoding="utf-8")
    for folder, program in (("recordings", "size_rvc_"), ("rec", "size_hubert_")):
        (tmp / folder).mkdir()
        for f in (DATA / "size_recordings").glob(f"{program}*"):
            shutil.copy(f, tmp / folder / f.name)


@dataclass(frozen=True)
class Ran:
    """What running one example gave."""

    command: str
    returncode: int
    output: str
    seconds: float


def _run_document(examples: list[Example], tmp: Path, corpus: list[str], cache: Path,
                  elsewhere: frozenset[str] = frozenset()) -> dict[str, Ran]:
    """Run one document's examples in order in `tmp` (those in `elsewhere` are run by another)."""
    import time

    tmp.mkdir(parents=True)
    _prepare(tmp, corpus)
    env = {**os.environ, "COLUMNS": "100", "ALLOCTUNE_CACHE_DIR": str(cache), "ALLOCTUNE_WORKERS": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    env.pop("ALLOCTUNE_DEBUG", None)
    out: dict[str, Ran] = {}
    for ex in examples:
        if ex.skip or ex.id in elsewhere:
            continue
        cmd = substitute(ex.command, tmp)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(["bash", "-c", cmd], cwd=tmp, env=env, capture_output=True, text=True,
                                  timeout=TIME_LIMIT_S, stdin=subprocess.DEVNULL)
            out[ex.id] = Ran(cmd, proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0)
        except subprocess.TimeoutExpired:
            out[ex.id] = Ran(cmd, -1, f"timed out after {TIME_LIMIT_S} s", time.perf_counter() - t0)
    return out


ALL = [ex for doc in DOCS for ex in extract(doc)]


def _drift(ex: Example) -> bool:
    return ex.doc == "README.md" and ex.command in README_DRIFT


@pytest.fixture(scope="session")
def ran(tmp_path_factory) -> dict[str, Ran]:
    """Every runnable example, documents side by side (each document's examples in order)."""
    import json

    if not TRACES.is_dir() or not (SHARED / "oom-messages" / "corpus.jsonl").is_file():
        pytest.skip(f"shared traces and OOM corpus not found under {SHARED}")
    if shutil.which("bash") is None or not (BIN / "alloctune").exists():
        pytest.skip("the examples are shell lines: they need bash and the alloctune script beside this python")
    corpus = [json.loads(x)["text"] for x in (SHARED / "oom-messages" / "corpus.jsonl").read_text().splitlines()]
    root = tmp_path_factory.mktemp("docs-run")
    by_doc: dict[str, list[Example]] = {}
    for ex in ALL:
        by_doc.setdefault(ex.doc, []).append(ex)
    # An example printed in several documents (README and its page) runs once, where it first appears;
    # not one whose output a shell redirect keeps for a later example of its own document.
    first: dict[str, str] = {}
    repeats: dict[str, str] = {}
    for ex in ALL:
        if ex.skip or ">" in ex.command:
            continue
        if ex.command in first:
            repeats[ex.id] = first[ex.command]
        else:
            first[ex.command] = ex.id
    results: dict[str, Ran] = {}
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as pool:
        jobs = [pool.submit(_run_document, exs, root / doc.replace("/", "_"), corpus, root / "cache",
                            frozenset(repeats)) for doc, exs in by_doc.items()]
        for job in jobs:
            results.update(job.result())
    results.update({again: results[once] for again, once in repeats.items() if once in results})
    return results


@pytest.mark.parametrize("example", [e for e in ALL if not e.skip], ids=lambda e: e.id)
def test_example_runs(ran, example):
    got = ran[example.id]
    if _drift(example):
        fixed = got.returncode == example.exit_code and "Traceback (most recent call last)" not in got.output
        assert not fixed, f"{example.id} runs now: remove it from README_DRIFT"
        pytest.xfail(f"README drift, fix: {README_DRIFT[example.command]}")
    assert "Traceback (most recent call last)" not in got.output, f"{got.command}\n{got.output}"
    assert got.returncode == example.exit_code, (
        f"{example.id}: `{example.command}` exited {got.returncode}, the doc says {example.exit_code}\n"
        f"ran: {got.command}\n{got.output[-3000:]}")
    if example.exit_code == 2:
        errors = [x for x in got.output.splitlines() if x.startswith("alloctune: error:")]
        assert len(errors) == 1, got.output


def test_the_docs_have_examples_and_the_skips_are_few_and_named():
    """The extraction sees the docs (a broken extractor would pass everything), and what is not run
    says why: GPU work, or a marked block."""
    run = [e for e in ALL if not e.skip]
    assert len(run) >= 60, [e.id for e in run]
    assert {e.doc for e in run} >= {"README.md", "docs/usage/explain.md", "docs/usage/simulate.md",
                                    "docs/usage/diagnose.md", "docs/usage/plan.md", "docs/usage/config.md"}
    for e in ALL:
        assert e.skip == "" or e.skip.startswith(("GPU: ", "marked ")) or " is the store " in e.skip, e
    marked = [e.id for e in ALL if e.skip.startswith("marked ")]
    assert len(marked) <= 3, marked


def test_readme_drift_entries_still_drift():
    """An entry of README_DRIFT whose example no longer exists must be removed (one that runs now
    fails `test_example_runs` until it is removed)."""
    printed = {e.command for e in ALL if e.doc == "README.md"}
    assert set(README_DRIFT) <= printed, sorted(set(README_DRIFT) - printed)


def test_all_examples_take_under_a_minute(ran):
    total = sum(r.seconds for r in ran.values())
    slow = sorted(((r.seconds, k) for k, r in ran.items()), reverse=True)[:5]
    assert total < 4 * TIME_LIMIT_S, slow  # CPU seconds of all documents; they run side by side


def test_placeholders_are_only_substituted_as_words(tmp_path):
    assert substitute("alloctune explain run.pickle.xz --html explain.html", tmp_path).endswith(
        f" explain {TRACES}/rvc_ec1/default.pickle.xz --html explain.html")
    assert "my_run.pickle" in substitute("alloctune explain my_run.pickle", tmp_path)
    assert substitute('alloctune config check "..." --json', tmp_path).endswith(
        'config check "expandable_segments:True" --json')
    assert _strip_comment('alloctune x "a # b"  # note') == 'alloctune x "a # b"'
