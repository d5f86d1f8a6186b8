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
        file: Path = typer.Argument(
            ...,
            help="Snapshot (.pickle, .pickle.gz, .pickle.xz), compact trace, or a shipped trace's name (alloctune demo --list).",
        ),
        device: Optional[int] = typer.Option(None, "--device", "-d", help="Device index (needed if several recorded)."),
        partial: bool = typer.Option(False, "--partial", help="Accept a history whose beginning is missing."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Requests by kind, streams, peaks, segment and OOM events, settings, inferred empty_cache() calls."""
        from alloctune.cli.render import err_console
        from alloctune.progress import progress_on_stderr
        from alloctune.trace.service import trace_info

        with progress_on_stderr(quiet=json_out, console=err_console) as progress:
            summary = trace_info(file, device, partial=partial, progress=progress)
        if json_out:
            from alloctune.cli.common import print_json
            from alloctune.schema import with_schema

            print_json(with_schema("trace-info", summary.to_dict()))
            return
        _render_info(summary)

    @trace_app.command("convert")
    def convert(
        file: Path = typer.Argument(..., help="Snapshot to convert (or a shipped trace's name)."),
        out: Path = typer.Argument(..., help="Output file (alloctune compact trace, e.g. NAME.trace.json.xz)."),
        device: Optional[int] = typer.Option(None, "--device", "-d", help="Device index (needed if several recorded)."),
        json_out: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Save a snapshot in alloctune's compact format (xz JSON: requests, segment events, settings, meta)."""
        from alloctune.cli.common import console, print_json
        from alloctune.cli.render import err_console
        from alloctune.progress import progress_on_stderr
        from alloctune.trace.service import convert_trace
        from alloctune.units import format_size

        with progress_on_stderr(quiet=json_out, console=err_console) as progress:
            done = convert_trace(file, out, device, progress=progress)
        if json_out:
            print_json(done)
            return
        console.print(
            f"wrote {done.output}: {done.requests} requests, {done.segment_events} segment events, "
            f"{format_size(done.output_bytes)} (input {format_size(done.input_bytes)})",
            markup=False,
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
    t.add_row("peak requested (live)", f"{format_size(s.peak_requested_bytes)} ({s.peak_requested_bytes} bytes)")
    t.add_row("live at end", str(s.live_at_end))
    t.add_row("segment events", ", ".join(f"{k} {v}" for k, v in s.segment_events.items()) or "none")
    t.add_row(
        "peak reserved (recorded)",
        f"{format_size(s.recorded_peak_reserved_bytes)} ({s.recorded_peak_reserved_bytes} bytes)",
    )
    t.add_row("OOM events", str(s.oom_events))
    t.add_row("inferred empty_cache()", str(s.inferred_empty_cache))
    if s.total_memory:
        t.add_row("device total", f"{format_size(s.total_memory)} ({s.total_memory} bytes)")
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
