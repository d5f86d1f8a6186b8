"""`alloctune trace info|convert`: inspect a recorded allocator history, save it compactly."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    trace_app = typer.Typer(
        help="Inspect recorded allocator histories (torch.cuda.memory._dump_snapshot files).",
        no_args_is_help=True,
    )
    app.add_typer(trace_app, name="trace")

    @trace_app.command("info")
    def info(
        file: Path = typer.Argument(..., help="Snapshot (.pickle, .pickle.gz, .pickle.xz) or compact trace."),
        device: Optional[int] = typer.Option(None, "--device", "-d", help="Device index (needed if several recorded)."),
        partial: bool = typer.Option(False, "--partial", help="Accept a history whose beginning is missing."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Requests by kind, streams, peaks, segment and OOM events, settings, inferred empty_cache() calls."""
        from alloctune.trace.load import load_trace
        from alloctune.trace.summary import summarize

        if device is not None and device < 0:
            from alloctune.errors import InputError

            raise InputError(f"--device must be 0 or more, got {device}")
        from alloctune.cli.progress import progress_on_stderr

        with progress_on_stderr(quiet=json_out) as progress:
            progress(f"loading {file}")
            summary = summarize(load_trace(file, device, partial=partial))
        if json_out:
            from alloctune.cli.common import print_json
            from alloctune.schema import with_schema

            print_json(with_schema("trace-info", summary.to_dict()))
            return
        _render_info(summary)

    @trace_app.command("convert")
    def convert(
        file: Path = typer.Argument(..., help="Snapshot to convert."),
        out: Path = typer.Argument(..., help="Output file (alloctune compact trace, e.g. NAME.trace.json.xz)."),
        device: Optional[int] = typer.Option(None, "--device", "-d", help="Device index (needed if several recorded)."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Save a snapshot in alloctune's compact format (xz JSON: requests, segment events, settings, meta)."""
        from alloctune.errors import InputError
        from alloctune.schema import schema_id
        from alloctune.trace.compact import save_compact
        from alloctune.trace.load import load_trace

        if out.exists() and out.is_dir():
            raise InputError(f"{out}: is a directory; give the output file name")
        from alloctune.cli.progress import progress_on_stderr

        with progress_on_stderr(quiet=json_out) as progress:
            progress(f"loading {file}")
            trace = load_trace(file, device)
        try:
            written = save_compact(trace, out)
        except OSError as exc:
            raise InputError(f"{out}: cannot write: {exc.strerror or exc}") from exc
        in_size = file.stat().st_size
        result = {
            "schema": schema_id("trace-convert"),
            "source": str(file),
            "output": str(out),
            "requests": len(trace.requests),
            "segment_events": len(trace.segment_events),
            "input_bytes": in_size,
            "output_bytes": written,
        }
        if json_out:
            from alloctune.cli.common import print_json

            print_json(result)
            return
        from alloctune.cli.common import console
        from alloctune.units import format_size

        console.print(
            f"wrote {out}: {result['requests']} requests, {result['segment_events']} segment events, "
            f"{format_size(written)} (input {format_size(in_size)})"
        )


def _render_info(s) -> None:  # s: TraceSummary
    from alloctune.cli.render import console, kv_table
    from alloctune.units import format_size

    t = kv_table([], title=f"{s.source} (device {s.device})")
    if s.meta:
        t.add_row("run", ", ".join(f"{k}={v!r}" if k == "conf" else f"{k}={v}" for k, v in s.meta.items()))
    kinds = ", ".join(f"{k} {v}" for k, v in s.requests_by_kind.items())
    t.add_row("requests", f"{s.requests} ({kinds})")
    t.add_row("streams", ", ".join(map(str, s.streams)) or "-")
    t.add_row("peak requested (live)", f"{format_size(s.peak_requested_bytes)} ({s.peak_requested_bytes} B)")
    t.add_row("live at end", str(s.live_at_end))
    t.add_row("segment events", ", ".join(f"{k} {v}" for k, v in s.segment_events.items()) or "none")
    t.add_row(
        "peak reserved (recorded)",
        f"{format_size(s.recorded_peak_reserved_bytes)} ({s.recorded_peak_reserved_bytes} B)",
    )
    t.add_row("OOM events", str(s.oom_events))
    t.add_row("inferred empty_cache()", str(s.inferred_empty_cache))
    if s.total_memory:
        t.add_row("device total", f"{format_size(s.total_memory)} ({s.total_memory} B)")
    st = s.allocator_settings
    if st:
        shown = {k: v for k, v in st.items() if k != "roundup_power2_divisions"}
        rp = st.get("roundup_power2_divisions")
        if isinstance(rp, dict) and any(rp.values()):
            shown["roundup_power2_divisions"] = {k: v for k, v in rp.items() if v}
        t.add_row("allocator settings", ", ".join(f"{k}={v!r}" for k, v in shown.items()))
    else:
        t.add_row("allocator settings", "not recorded")
    console.print(t)
