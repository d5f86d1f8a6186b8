"""Numbers and sizes on the command line (#18.17): a bare size, 0, NaN, negatives are one-line errors.

`simulate`'s own cases are in test_sim_cli.py, `config check`'s in test_config.py, `diagnose`'s in
test_diagnose_cli.py; this file covers the other commands and the parsing helpers."""

from __future__ import annotations

import math

import pytest

from alloctune.errors import InputError, SizeError
from alloctune.units import GiB, parse_seconds, parse_user_size
from cli_run import run_cli as _run


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--budget", "6", "--", "true"], "--budget 6: give a unit"),
        (["run", "--budget", "0GiB", "--", "true"], "more than 0"),
        (["run", "--budget", "nan", "--", "true"], "finite"),
        (["run", "--timeout", "nan", "--", "true"], "--timeout must be a positive number of seconds"),
        (["run", "--timeout", "inf", "--", "true"], "--timeout must be a positive number of seconds"),
        (["run", "--timeout", "0", "--", "true"], "--timeout must be a positive number of seconds"),
        (["run", "--cudnn-benchmark", "yes", "--", "true"], "--cudnn-benchmark 'yes' is not known: use on or off"),
        (["watch", "--interval", "nan"], "--interval must be a positive number of seconds"),
        (["watch", "--interval=-1"], "--interval must be a positive number of seconds"),
        (["trace", "info", "x.pickle", "--device", "-1"], "--device must be 0 or more"),
        (["report", "x.jsonl", "--device", "-1"], "--device must be 0 or more"),
        (["config", "check", "", "--card", "0GiB"], "--card must be more than 0"),
        # #28.6: every size option takes the same parser; a bare number says what was probably meant
        (["plan", "a.pickle:7", "--card", "8"], "--card 8: give a unit: did you mean 8GiB?"),
        (["plan", "a.pickle:7", "--cap", "4GiB,3"], "--cap 3: give a unit: did you mean 3GiB?"),
        (["plan", "a.pickle:7", "--context", "512"], "--context 512: give a unit"),
        (["demo", "--budget", "2"], "--budget 2: give a unit: did you mean 2GiB?"),
        (["tune", "--budget", "6", "--", "true"], "--budget 6: give a unit: did you mean 6GiB?"),
        # a count of bytes pasted from a tool's output: bytes is what was meant
        (["plan", "a.pickle:7", "--cap", "1491075072"], "did you mean 1491075072B (bytes, 1.39 GiB)?"),
    ],
)
def test_bad_numbers_are_one_line_errors(capsys, args, needle):
    code, out, err = _run(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("alloctune: error: ") and err.count("\n") == 1 and needle in err, err


def test_parse_user_size():
    assert parse_user_size("6GiB") == 6 * GiB and parse_user_size("6 G") == 6 * GiB
    assert parse_user_size("512B") == 512 and parse_user_size(512) == 512  # ints are bytes (Python API)
    for bad, needle in (("6", "give a unit"), ("0MiB", "more than 0"), ("-2GiB", "more than 0"),
                        ("nan", "finite"), ("infGiB", "finite"), ("6 parsecs", "unknown unit"), ("", "cannot read"),
                        (0, "more than 0"), (True, "not a size")):
        with pytest.raises(SizeError, match=needle):
            parse_user_size(bad, "--budget")


def test_parse_seconds():
    assert parse_seconds(None) is None and parse_seconds(2) == 2.0
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(InputError, match="--timeout must be a positive number of seconds"):
            parse_seconds(bad)
