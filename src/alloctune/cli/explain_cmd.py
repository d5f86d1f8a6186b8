"""`alloctune explain REC [--against A]`: where the memory goes at the peak (or OOM, or --at)."""

from __future__ import annotations

import typer

from alloctune.cli import options


def register(app: typer.Typer) -> None:
    @app.command("explain")
    def explain(
        recordings: options.ExplainRecordings,
        against: options.ExplainAgainst = None,
        at: options.ExplainAt = None,
        group: options.ExplainGroup = "line",
        top: options.ExplainTop = 20,
        what_if: options.ExplainWhatIf = True,
        what_if_dir: options.ExplainWhatIfDir = None,
        device: options.RecordedDevice = None,
        json_out: options.Json = False,
        calibration: options.ExplainCalibration = None,
        html_out: options.ExplainHtml = None,
    ) -> None:
        """Where the memory goes: categories that sum exactly to reserved memory, sites, growth, simulated what-ifs.

        A site is your line and the library frame under it; growth is per repetition."""
        from alloctune import api
        from alloctune.cli.common import print_json
        from alloctune.cli.explain_view import render, render_against, render_ranks
        from alloctune.cli.render import err_console
        from alloctune.errors import InputError
        from alloctune.progress import progress_on_stderr

        if calibration and (len(recordings) > 1 or against is not None):
            raise InputError("--calibration takes one recording (the program's, uncapped), not ranks or --against")
        if len(recordings) > 1:
            if against is not None or at is not None:
                raise InputError("--against and --at take one recording; several recordings are the ranks of one job")
            imb = api.explain(recordings, group=group, top=top)
            if json_out:
                print_json(imb.to_dict())
            else:
                render_ranks(imb)
            return
        recording = recordings[0]

        at_value: object = at
        if at is not None and not at.strip().endswith("s"):
            try:
                at_value = int(at)
            except ValueError:
                raise InputError(f"--at {at!r}: expected an event index or a time like 12.5s") from None
        if against is not None and html_out is not None:
            raise InputError("--html writes the page of one recording; drop --against or --html")
        if against is not None:
            cmp = api.explain(recording, against=against, group=group, top=top, device=device)
            if json_out:
                print_json(cmp.to_dict())
            else:
                render_against(cmp)
            return
        if html_out is not None:  # the explanation and its page from one load
            from alloctune.report.explain_html import write_explain_html

            with progress_on_stderr(quiet=json_out, console=err_console) as progress:
                ex = write_explain_html(
                    recording,
                    html_out,
                    at=at_value,
                    group=group,
                    top=top,
                    what_if=what_if,
                    what_if_dir=what_if_dir,
                    device=device,
                    progress=progress,
                    calibrations=list(calibration or []),
                )
        else:
            with progress_on_stderr(quiet=json_out, console=err_console) as progress:
                ex = api.explain(
                    recording,
                    at=at_value,
                    group=group,
                    top=top,
                    what_if=what_if,
                    what_if_dir=what_if_dir,
                    device=device,
                    progress=progress,
                    calibrations=list(calibration or []),
                )
        if json_out:
            print_json(ex.to_dict())
        else:
            render(ex)
            if html_out is not None:
                from alloctune.cli.render import console

                console.print(f"wrote {html_out}", markup=False, soft_wrap=True)
