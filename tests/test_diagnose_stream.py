"""Issue 30, items 2-4: files recognised by content, many OOMs summarised in groups, the log read
as a stream (same reports as the whole text, bounded memory), templates equal to the grammar."""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import random
import re
import subprocess
import sys
import tracemalloc

import pytest

from alloctune.diagnose import find_reports
from alloctune.diagnose.find import BIG_TEXT, ReportFinder
from alloctune.diagnose.scan import scan_reports
from alloctune.diagnose.text import decode_log, iter_log_text

ENV = {"PATH": "/usr/bin:/bin", "COLUMNS": "120", "PYTHONIOENCODING": "utf-8",
       **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}


def cli(*args: str, stdin: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "alloctune", "diagnose", *args], input=stdin, capture_output=True,
                          env=ENV, timeout=timeout)


def modern(req_gib: float, free_mib: float = 0.0, unalloc_gib: float = 2.30, dev: int = 0) -> str:
    """A 2.2+ message; with nothing free and 2.30 GiB cached, a request under 2.30 GiB is fragmentation
    (shortfall = the request) and one above it a shortage (test_diagnose_verdict pins both)."""
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req_gib:.2f} GiB. GPU {dev} has a total "
            f"capacity of 6.00 GiB of which {free_mib:.2f} MiB is free. Of the allocated memory 2.93 GiB is allocated "
            f"by PyTorch, and {unalloc_gib:.2f} GiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.")


_SIZE = re.compile(r"(\d+\.\d+)(\s*)(bytes|[KMGT]i?B)")


def varied_log(corpus_path, n: int, seed: int = 7) -> str:
    """`n` messages of every corpus form, sizes varied, prefixed as torchrun prints them."""
    forms = []
    for line in corpus_path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            forms += [r.raw for r in find_reports(json.loads(line)["text"])]
    rnd = random.Random(seed)
    out = []
    for k in range(n):
        form = forms[k % len(forms)]
        msg = _SIZE.sub(lambda m: f"{rnd.uniform(1, 999):.2f}{m.group(2)}{m.group(3)}", form)
        if k % 5 == 1:  # re-wrapped at words (a pasted or mailed log), some with CRLF
            msg = re.sub(r"(\S{20,}?) ", lambda m: m.group(1) + ("\r\n" if k % 10 == 1 else "\n"), msg)
        out.append(f"[rank{k % 4}] step {k}: {msg}\n" + ("INFO continuing\n" if k % 3 == 0 else ""))
    return "".join(out)


# ---- the templates give the grammar's reports -----------------------------------------------

def test_templates_read_exactly_what_the_grammar_reads(oom_corpus):
    text = varied_log(oom_corpus, 1500)
    big = len(text) > BIG_TEXT
    fast = ReportFinder()
    got = list(fast.scan(text, 0, len(text), big=big))
    want = list(ReportFinder(fast=False).scan(text, 0, len(text), big=big))
    assert len(got) == len(want) >= 1500
    assert got == want
    assert fast.fast.count > 0  # the templates were used, not silently bypassed


@pytest.mark.parametrize("after", [
    " | GUI suffix on the same line",                 # more on the line: the grammar decides
    "\nOf the allocated memory 1.00 GiB is allocated by PyTorch",  # a next line that continues it
    "\n[rank0]: Including non-PyTorch memory, this process has 5.00 GiB memory in use.",
    "\n&nbsp;Process 12 has 1.00 GiB memory in use.",
])
def test_a_template_never_cuts_what_the_grammar_would_read_on(after):
    first = modern(1.0) + "\n"
    text = first + modern(1.5).replace(" If reserved but unallocated memory is large try setting "
                                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
                                       "") + after + "\n"
    text = modern(1.0).replace(" If reserved but unallocated memory is large try setting "
                               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.", "") + "\n" + text
    got = list(ReportFinder().scan(text, 0, len(text), big=False))
    want = list(ReportFinder(fast=False).scan(text, 0, len(text), big=False))
    assert got == want


# ---- streaming ------------------------------------------------------------------------------

@pytest.mark.parametrize("piece", [997, 65536, 1 << 20])
def test_stream_gives_the_reports_and_lines_of_the_whole_text(oom_corpus, piece):
    corpus = "\n".join(json.loads(ln)["text"] for ln in oom_corpus.read_text(encoding="utf-8").splitlines() if ln.strip())
    text = corpus + "\n" + varied_log(oom_corpus, 400) + corpus
    whole = find_reports(text)
    found = list(scan_reports(text[i:i + piece] for i in range(0, len(text), piece)))
    assert [f.report for f in found] == whole
    assert [f.line for f in found] == [text.count("\n", 0, r.span[0]) + 1 for r in whole]
    ranks = {f.rank for f in found}
    assert {0, 1, 2, 3} <= ranks


def test_stream_memory_does_not_grow_with_the_log():
    def pieces(n_mb: int):
        rnd = random.Random(1)
        for _ in range(n_mb):
            yield "".join(f"[rank{k % 8}] step {k}: " + modern(rnd.uniform(0.1, 4), rnd.uniform(0, 900)) + "\n"
                          for k in range(1700))  # ~1 MB

    peaks = []
    for n in (4, 16):
        tracemalloc.start()
        try:
            count = sum(1 for _ in scan_reports(pieces(n)))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert count == 1700 * n
    assert peaks[1] < 1.3 * peaks[0], peaks  # 4x the log, about the same memory
    assert peaks[1] < 40e6, peaks


@pytest.mark.parametrize("enc", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be"])
def test_incremental_decoding_equals_decode_log(enc):
    data = ("é CUDA out of memory 日本語\r\n" * 3000).encode(enc) + (b"\xff\xfe" if enc == "utf-8" else b"")
    assert "".join(iter_log_text(io.BytesIO(data).read, 1001)) == decode_log(data)


# ---- many OOMs, summarised ------------------------------------------------------------------

def _group_log() -> tuple[str, dict]:
    """Fragmentation on rank 0 (requests 1.0-1.9 GiB, in the 1-2 GiB range), shortage on rank 1
    (requests 2.5-3.9 GiB), interleaved with ordinary lines; what we wrote is the expectation."""
    lines, expect = [], {("fragmentation", 0): [], ("shortage", 1): []}
    for k in range(60):
        lines.append(f"step {k} loss=0.{k}")
        if k % 2 == 0:
            req = 1.0 + (k % 10) / 10
            lines.append(f"[rank0] step {k}: " + modern(req))
            expect[("fragmentation", 0)].append((len(lines), req))
        else:
            req = 2.5 + (k % 15) / 10
            lines.append(f"[rank1] step {k}: " + modern(req, dev=1))
            expect[("shortage", 1)].append((len(lines), req))
    return "\n".join(lines) + "\n", expect


def test_groups_count_first_last_and_worst(tmp_path):
    text, expect = _group_log()
    p = tmp_path / "log.txt"
    p.write_text(text)
    res = cli(str(p), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["schema"] == "alloctune.diagnose/1" and out["messages"] == 60
    by_key = {(g["verdict"], g["rank"]): g for g in out["groups"]}
    assert set(by_key) == set(expect)
    for key, members in expect.items():
        g = by_key[key]
        assert g["count"] == len(members)
        assert (g["first_line"], g["last_line"]) == (members[0][0], members[-1][0])
        worst_line = max(members, key=lambda m: (m[1], -m[0]))[0]  # the largest request, first seen
        assert g["worst"]["line"] == worst_line
        assert g["fix"]["covers"] == g["count"]
    assert by_key[("fragmentation", 0)]["fix"]["id"] == "expandable_segments"
    assert by_key[("fragmentation", 0)]["requests"] == [2**30, 2**31]
    assert len(out["diagnoses"]) == 2


def test_output_is_bounded_by_the_groups(tmp_path):
    sizes = []
    for n in (100, 1000):
        rnd = random.Random(n)
        p = tmp_path / f"log{n}.txt"
        p.write_text("".join(f"[rank0] step {k}: " + modern(rnd.uniform(1.0, 1.99)) + "\n" for k in range(n)))
        res = cli(str(p), "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["messages"] == n
        term = cli(str(p))
        assert term.returncode == 0 and f"{n:,} out-of-memory messages in 1 group" in term.stdout.decode()
        sizes.append((len(res.stdout), len(term.stdout)))
    (j1, t1), (j2, t2) = sizes
    assert j2 < 1.1 * j1 and t2 < 1.1 * t1, sizes


def test_a_terminal_shows_the_largest_groups_and_counts_the_rest(tmp_path):
    """A multi-rank log of many groups: the terminal shows the `SHOWN` largest and one line for the
    others (their count and messages, checked against the JSON's groups); --all shows every one."""
    from alloctune.cli.diagnose_cmd import SHOWN

    rnd = random.Random(8)
    ranks = SHOWN + 15
    lines = [f"[rank{k % ranks}] step {k}: " + modern(rnd.uniform(1.0, 1.99)) for k in range(ranks * 3 + SHOWN)]
    p = tmp_path / "log.txt"
    p.write_text("\n".join(lines) + "\n")
    groups = json.loads(cli(str(p), "--json").stdout)["groups"]
    assert len(groups) == ranks
    rest = groups[SHOWN:]
    term = cli(str(p)).stdout.decode()
    assert f"{len(rest)} smaller group(s) with {sum(g['count'] for g in rest)} message(s) not shown" in term
    assert all(f"rank {g['rank']}" in term for g in groups[:SHOWN])
    assert "rank" not in term.split("not shown")[1]
    every = cli(str(p), "--all").stdout.decode()
    assert "not shown" not in every and all(f"rank {g['rank']}" in every.split("out-of-memory messages")[-1]
                                            for g in groups)


def test_all_streams_every_message_as_json_lines(tmp_path):
    text, expect = _group_log()
    p = tmp_path / "log.txt"
    p.write_text(text)
    res = cli(str(p), "--json", "--all")
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in res.stdout.decode().splitlines()]
    assert len(rows) == 61
    assert all(r["schema"] == "alloctune.diagnose-message/1" for r in rows[:-1])
    assert [r["line"] for r in rows[:-1]] == sorted(line for m in expect.values() for line, _ in m)
    assert rows[-1]["schema"] == "alloctune.diagnose/1" and rows[-1]["messages"] == 60
    term = cli(str(p), "--all").stdout.decode()
    assert len(re.findall(r"^line \d+: (FRAGMENTATION|SHORTAGE)", term, re.M)) == 60


def test_a_single_oom_repeated_keeps_the_full_output(tmp_path):
    p = tmp_path / "log.txt"
    p.write_text(("noise\n" + modern(1.7) + "\n") * 3)
    out = cli(str(p)).stdout.decode()
    assert "FRAGMENTATION" in out and "seen 3x" in out and "bash:" in out and "group" not in out
    data = json.loads(cli(str(p), "--json").stdout)
    assert [d["occurrences"] for d in data["diagnoses"]] == [3]


# ---- files recognised by content ------------------------------------------------------------

def test_a_snapshot_file_goes_where_snapshot_goes(traces_dir):
    snap = str(traces_dir / "llm" / "default_cap85.pickle.xz")
    plain = cli(snap, "--json", "--no-what-if", timeout=600)
    flag = cli("--snapshot", snap, "--json", "--no-what-if", timeout=600)
    assert plain.returncode == flag.returncode == 0, plain.stderr
    assert json.loads(plain.stdout) == json.loads(flag.stdout)
    assert json.loads(plain.stdout)["verdict"] == "fragmentation"


def test_a_compact_trace_goes_where_snapshot_goes(traces_dir, tmp_path):
    from alloctune.trace import load_trace, save_compact

    out = tmp_path / "run.trace.xz"
    save_compact(load_trace(traces_dir / "rvc_ec0" / "default.pickle.xz"), out)
    plain, flag = cli(str(out)), cli("--snapshot", str(out))
    assert plain.returncode == flag.returncode == 2
    assert plain.stderr == flag.stderr and b"compact trace" in plain.stderr


@pytest.mark.parametrize("data,needle", [
    (b"\x89PNG\r\n\x1a\n" + bytes(200), "looks like a PNG image"),
    (b"PK\x03\x04" + bytes(200), "a ZIP archive (a torch.save checkpoint is one)"),
    (bytes(range(256)) * 8, "looks like binary data"),
    (gzip.compress(bytes(range(256)) * 8), "looks like binary data (gzip-compressed)"),
])
def test_anything_else_is_one_line_saying_what_it_looks_like(tmp_path, data, needle):
    p = tmp_path / "thing.log"
    p.write_bytes(data)
    res = cli(str(p))
    lines = res.stderr.decode().strip().splitlines()
    assert res.returncode == 2 and res.stdout == b""
    assert len(lines) == 1 and lines[0].startswith("alloctune: error:") and needle in lines[0]


def test_compressed_logs_and_their_damage(tmp_path):
    p = tmp_path / "log.txt.gz"
    p.write_bytes(gzip.compress(("x\n" + modern(1.7) + "\n").encode()))
    assert json.loads(cli(str(p), "--json").stdout)["diagnoses"][0]["verdict"] == "fragmentation"
    bad = tmp_path / "cut.gz"
    bad.write_bytes(gzip.compress(("x\n" * 100000 + modern(1.7)).encode())[:300])
    res = cli(str(bad))
    assert res.returncode == 2 and b"truncated or corrupt" in res.stderr and b"Traceback" not in res.stderr


def test_utf16_log_through_stdin():
    data = codecs.BOM_UTF16_LE + ("PS C:\\> python train.py\r\n" + modern(1.7) + "\r\n").encode("utf-16-le")
    res = cli("-", "--json", stdin=data)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["diagnoses"][0]["platform"] == "windows"


def test_progress_waits_before_drawing():
    from rich.console import Console

    from alloctune.progress import progress_on_stderr

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=80, color_system=None)
    with progress_on_stderr(console=con, after=60) as progress:
        progress("reading the log", 1, 2)
    assert buf.getvalue() == ""
    with progress_on_stderr(console=con, after=0) as progress:
        progress("reading the log", 1, 2)
    assert "reading the log" in buf.getvalue()
    buf.truncate(0)
    import time

    with progress_on_stderr(console=con, after=0.2) as progress:  # one report, then silence: still drawn
        progress("replaying the standard settings")
        time.sleep(0.6)
    assert "replaying the standard settings" in buf.getvalue()


# ---- several processes ----------------------------------------------------------------------

def test_parallel_summary_equals_one_pass(oom_corpus):
    """Chunks cut everywhere (small chunks, multi-line messages across the cuts): the merged
    summary is the one-pass summary, field for field."""
    from alloctune.diagnose.groups import summarise
    from alloctune.diagnose.parallel import summarise_parallel

    corpus = "\n".join(json.loads(ln)["text"] for ln in oom_corpus.read_text(encoding="utf-8").splitlines() if ln.strip())
    text = varied_log(oom_corpus, 600) + corpus + varied_log(oom_corpus, 300, seed=3)
    pieces = [text[i:i + 50_000] for i in range(0, len(text), 50_000)]
    one = summarise(scan_reports(pieces)).to_dict()
    for size, small, first in ((30_000, 30_000, 30_000), (77_777, 20_011, 50_000), (40_000, 9_999, 5_000)):
        for n in (2, 3):  # the chunks read here and by the workers interleave
            assert summarise_parallel(pieces, None, n=n, size=size, small=small, first=first).to_dict() == one


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes are a Linux fcntl")
def test_the_pools_pipes_hold_a_whole_result():
    import fcntl
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path

    from alloctune.diagnose.parallel import PIPE, _wide_pipes

    if int(Path("/proc/sys/fs/pipe-max-size").read_text()) < PIPE and os.geteuid() != 0:
        pytest.skip("this system caps pipes below the size asked for")
    pool = ProcessPoolExecutor(max_workers=1)
    try:
        _wide_pipes(pool)
        ends = [pool._result_queue._reader, pool._result_queue._writer, pool._call_queue._writer]
        assert all(fcntl.fcntl(e.fileno(), fcntl.F_GETPIPE_SZ) >= PIPE for e in ends)
        assert pool.submit(sum, [1, 2]).result() == 3  # and the pool still works
    finally:
        pool.shutdown()


def test_workers_default_to_the_idle_cpus(monkeypatch):
    import os
    import sys

    from alloctune.diagnose import parallel
    from alloctune.diagnose.parallel import workers

    if sys.platform.startswith("linux"):  # the kernel's count of what runs now, this process not included
        assert isinstance(parallel._running_elsewhere(), int) and parallel._running_elsewhere() >= 0

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.delenv("ALLOCTUNE_WORKERS", raising=False)
    monkeypatch.setattr(parallel, "_running_elsewhere", lambda: None)  # the load average alone
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert workers() == max(1, min(cpus, 8))  # an idle machine: every CPU
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cpus), 0.0, 0.0))
    assert workers() == 1  # every CPU busy with other work: this process alone
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus - 0.2, 0.0, 0.0))
    assert workers() == 1  # less than a quarter of a CPU idle
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus - 1.2, 0.0, 0.0))
    assert workers() == min(2, cpus, 8)  # one idle CPU: one worker beside this process
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus - 0.5, 0.0, 0.0))
    assert workers() == min(2, cpus, 8)  # half of one
    monkeypatch.setenv("ALLOCTUNE_WORKERS", "auto")
    assert workers() == min(2, cpus, 8)
    # runnable now: a load average still high from processes that ended counts what runs now
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cpus), 0.0, 0.0))
    monkeypatch.setattr(parallel, "_running_elsewhere", lambda: 0)
    assert workers() == max(1, min(cpus, 8))
    monkeypatch.setattr(parallel, "_running_elsewhere", lambda: cpus)
    assert workers() == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert workers() == max(1, min(cpus, 8))  # (a burst now, an idle minute: the smaller)
    monkeypatch.setenv("ALLOCTUNE_WORKERS", "1")
    assert workers() == 1  # one pass in this process
    monkeypatch.setenv("ALLOCTUNE_WORKERS", "3")
    assert workers() == 3


def test_a_small_log_starts_no_worker(monkeypatch, oom_corpus):
    """A log within the first chunk is read in this process: no worker is forked for it."""
    from alloctune.diagnose import parallel
    from alloctune.diagnose.groups import summarise

    def no_pool(*a, **k):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", no_pool)
    text = varied_log(oom_corpus, 200)
    assert len(text) < parallel.FIRST
    assert parallel.summarise_parallel([text], None, n=4).to_dict() == summarise(scan_reports([text])).to_dict()


def test_parallel_cut_inside_a_multiline_message():
    """Every chunk boundary may fall inside a six-line cudaMallocAsync message: the chunk after
    it is then read from where one pass reads on."""
    from alloctune.diagnose import parallel
    from alloctune.diagnose.groups import summarise
    from alloctune.diagnose.parallel import summarise_parallel

    rnd = random.Random(5)
    text = "".join(
        f"Allocation on device {k % 2} would exceed allowed memory. (out of memory)\n"
        f"Currently allocated     : {rnd.uniform(1, 20):.2f} GiB\nRequested               : {rnd.uniform(1, 900):.2f} MiB\n"
        f"Device limit            : 23.69 GiB\nFree (according to CUDA): {rnd.uniform(0, 9):.2f} MiB\n"
        "PyTorch limit (set by user-supplied memory fraction)\n                        : 17179869184.00 GiB\n"
        for k in range(400))
    spans = [f.report.span for f in scan_reports([text])]
    assert len(spans) == 400
    one = summarise(scan_reports([text])).to_dict()
    for size in (9_151, 9_250):  # a chunk is ~30 messages and a half: most cuts fall inside one
        cuts = [base + begin for _, begin, _, base, _ in parallel._chunks([text], size)]
        assert sum(any(s < c < e for s, e in spans) for c in cuts) >= 3  # the case under test happens
        assert summarise_parallel([text], None, n=2, size=size, small=size, first=size).to_dict() == one
        assert summarise_parallel([text], None, n=2, size=size, small=size // 3, first=size // 2).to_dict() == one


@pytest.mark.parametrize("head", [700, 1500, 4000])
def test_a_message_across_a_cut_is_read_again_in_the_head_only(monkeypatch, head):
    """A chunk's first `HEAD` characters are summarised apart: when a message runs across the
    chunk's start, only they are read again, and the chunk's own reading of the rest is kept when
    one pass reaches the point where it began; else the whole chunk is read again. Either way:
    the one-pass summary."""
    from alloctune.diagnose import parallel
    from alloctune.diagnose.groups import summarise
    from alloctune.diagnose.parallel import summarise_parallel

    rnd = random.Random(head)
    text = "".join(
        f"[rank{k % 4}] Allocation on device {k % 2} would exceed allowed memory. (out of memory)\n"
        f"Currently allocated     : {rnd.uniform(1, 20):.2f} GiB\nRequested               : {rnd.uniform(1, 900):.2f} MiB\n"
        f"Device limit            : 23.69 GiB\nFree (according to CUDA): {rnd.uniform(0, 9):.2f} MiB\n"
        "PyTorch limit (set by user-supplied memory fraction)\n                        : 17179869184.00 GiB\n"
        for k in range(500))
    one = summarise(scan_reports([text])).to_dict()
    monkeypatch.setattr(parallel, "HEAD", head)
    kept = []
    settled = parallel._settled

    def spy(task, result, pos, platform):
        done, end = settled(task, result, pos, platform)
        kept.append(pos > task[1] and len(done) == 2)
        return done, end

    monkeypatch.setattr(parallel, "_settled", spy)
    for size in (9_151, 9_250, 12_345):
        assert summarise_parallel([text], None, n=2, size=size, small=size, first=size).to_dict() == one
    assert any(kept)  # the case under test happens: a head read again, the rest kept


@pytest.mark.parametrize("failure", ["no processes", "worker dies"])
def test_without_workers_the_log_is_read_here(monkeypatch, oom_corpus, failure):
    """Workers are the default, so a machine that cannot start them (a sandbox without semaphores)
    or a worker that dies (the OOM killer) must not lose the diagnosis: this process reads on."""
    import concurrent.futures

    from alloctune.diagnose import parallel
    from alloctune.diagnose.groups import summarise

    class Dies:
        def __init__(self, *a, **k):
            if failure == "no processes":
                raise OSError(38, "Function not implemented")

        def submit(self, *a, **k):
            fut = concurrent.futures.Future()
            fut.set_exception(concurrent.futures.process.BrokenProcessPool("a worker died"))
            return fut

        def shutdown(self, *a, **k):
            pass

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", Dies)
    text = varied_log(oom_corpus, 600)
    want = summarise(scan_reports([text])).to_dict()
    assert parallel.summarise_parallel([text], None, n=2, size=20_000, small=9_000, first=9_000).to_dict() == want
