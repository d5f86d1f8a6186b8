"""`alloctune record [--size 7,14,28] -- CMD ARGS...`: parse, call `alloctune.run.record`, render.

The orchestration (agent, private raw folder, busiest process, compression, sidecar) is in
the core module `alloctune.run.record`; this module only checks the arguments and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from alloctune.cli.common import console, print_json, warn
from alloctune.errors import WorkloadFailed
from alloctune.run.record import DEFAULT_MAX_ENTRIES, DEFAULT_OUT, SCHEMA, cuda_device_count

RECORD_SCHEMA = SCHEMA


def _cuda_device_count() -> int:
    """Kept here so tests can stand in a device count for the CLI."""
    return cuda_device_count()


def register(app: typer.Typer) -> None:
    @app.command(
        "record",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def record(
        command: Optional[list[str]] = typer.Argument(  # noqa: UP007 - typer needs Optional here
            None, help="the command to run, after `--` (e.g. -- python infer.py --in a.wav)", show_default=False
        ),
        out: Path = typer.Option(Path(DEFAULT_OUT), "--out", "-o", help="trace file (.pickle, .pickle.gz, .pickle.xz)"),
        size: Optional[str] = typer.Option(  # noqa: UP007
            None,
            "--size",
            help="record once per input size (7,14,28): {size} in CMD is replaced, "
            "ALLOCTUNE_SIZE is set; files get -SIZE before the suffix (or fill {size} in --out)",
        ),
        conf: Optional[str] = typer.Option(None, "--conf", "-c", help="allocator setting to record under"),  # noqa: UP007
        max_entries: int = typer.Option(DEFAULT_MAX_ENTRIES, "--max-entries", help="allocator events kept (oldest dropped)"),
        device: Optional[int] = typer.Option(  # noqa: UP007
            None, "--device", help="CUDA device the run is measured on (default: current); the trace holds every device"
        ),
        workload: Optional[str] = typer.Option(None, "--workload", help="name in the sidecar (default: file name)"),  # noqa: UP007
        stacks: str = typer.Option(
            "python",
            "--stacks",
            metavar="python|all|none",
            help="frames kept with each allocation: python (where the memory goes: alloctune explain), "
            "all (with C++ frames), none (smallest file)",
        ),
        json_out: bool = typer.Option(False, "--json", help="print the result as JSON"),
    ) -> None:
        """Run CMD with allocator history on and write the trace (a `_dump_snapshot` pickle) and NAME.json.

        Every Python process of CMD that uses CUDA records from its CUDA start-up to its exit (or SIGTERM).

        The trace of the one that reserved the most memory is kept.

        Example: `alloctune record --out rvc.pickle.xz -- python -m alloctune.workloads.rvc --count 4`

        At several sizes: `alloctune record --size 7,14,28 --out rvc.pickle.xz -- python infer.py --seconds {size}`
        """
        from alloctune.run import record as core

        if stacks not in ("python", "all", "none"):
            from alloctune.errors import InputError

            raise InputError(f"--stacks {stacks!r} is not known: use python, all or none")
        core.check_request(command, out, max_entries, device, _cuda_device_count)
        kwargs = {"max_entries": max_entries, "device": device, "conf": conf, "workload": workload, "stacks": stacks}
        if size is None:
            rec = core.record(command, out, **kwargs)
            payload = {"schema": SCHEMA, **rec.to_dict(), "max_entries": max_entries, "device": device}
            if json_out:
                print_json(payload)
            else:
                console.print(
                    f"trace written to [bold]{rec.out}[/bold] ({rec.bytes / 2**20:.2f} MiB, command ran {rec.wall_s:.1f} s)"
                )
            if rec.exit_code != 0:
                if not json_out:
                    warn(f"the command exited with status {rec.exit_code}; the trace covers the run up to its exit")
                raise WorkloadFailed(f"the recorded command exited with status {rec.exit_code} (trace kept in {out})")
            return
        sizes = core.parse_sizes(size)
        if not any(core.SIZE_PLACEHOLDER in arg for arg in command or ()):
            warn(f"no {core.SIZE_PLACEHOLDER} in the command: each run gets its size only as {core.SIZE_ENV}")

        def show(rec: core.Recording) -> None:
            if not json_out:
                console.print(
                    f"size {rec.size}: {rec.outcome}, trace [bold]{rec.out}[/bold] ({rec.bytes / 2**20:.2f} MiB, "
                    f"{rec.wall_s:.1f} s)"
                )

        recs = core.record_sizes(command, out, sizes, progress=show, **kwargs)
        if json_out:
            print_json(
                {"schema": SCHEMA, "max_entries": max_entries, "device": device, "recordings": [r.to_dict() for r in recs]}
            )
        failed = [r.size for r in recs if r.exit_code != 0]
        if failed:
            raise WorkloadFailed(f"the command failed at size(s) {', '.join(map(str, failed))} (traces kept)")
