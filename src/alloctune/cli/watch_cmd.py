"""`alloctune watch`: GPU memory per device and process, with allocator numbers for `alloctune run` jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("watch")
    def watch(
        interval: float = typer.Option(1.0, "--interval", "-i", help="Seconds between samples."),
        count: Optional[int] = typer.Option(None, "--count", "-n", help="Stop after N samples (default: until Ctrl-C)."),
        csv: Optional[Path] = typer.Option(None, "--csv", help="Append every sample to this CSV file."),
        state_dir: Optional[Path] = typer.Option(
            None,
            "--state-dir",
            help="Where `alloctune run` jobs publish live stats (default $ALLOCTUNE_STATE_DIR or ~/.cache/alloctune/live).",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print each sample as one JSON line instead of the view."),
    ) -> None:
        """Live view of GPU memory per device and process, like `nvidia-smi -l 1`.

        Adds reserved / allocated / inactive-split bytes, utilization and retries of processes started by `alloctune run`."""
        import sys

        from alloctune.errors import InputError
        from alloctune.monitor import PynvmlFacade, SampleLog, sample_table, samples
        from alloctune.units import parse_seconds

        interval = parse_seconds(interval, "--interval")
        if count is not None and count < 1:
            raise InputError(f"--count must be at least 1, got {count}")
        nvml = PynvmlFacade()
        log = SampleLog(csv, sys.stdout if json_out else None)
        try:
            stream = samples(nvml, interval, count, state_dir)
            if json_out:
                for sample in stream:
                    log.write(sample)
                return
            from rich.live import Live

            from alloctune.cli.common import console

            first = next(stream)
            log.write(first)
            with Live(sample_table(first, width=console.width), console=console, auto_refresh=False, transient=False) as live:
                for sample in stream:
                    log.write(sample)
                    live.update(sample_table(sample, width=console.width), refresh=True)
        except KeyboardInterrupt:
            pass
        finally:
            log.close()
            nvml.close()
