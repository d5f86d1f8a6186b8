"""The one reader behind `diagnose`'s log and every trace file: same wording, the caller's error class."""

from __future__ import annotations

import pytest

from alloctune.diagnose.service import read_log
from alloctune.errors import InputError, TraceError
from alloctune.trace.input_file import read_input_bytes
from alloctune.trace.safe_pickle import read_decompressed


def test_log_and_snapshot_fail_alike(tmp_path):
    missing = tmp_path / "nope.log"
    with pytest.raises(InputError, match=r"nope\.log: no such file$") as log_err:
        read_log(missing)
    assert not isinstance(log_err.value, TraceError)
    with pytest.raises(TraceError, match=r"nope\.log: no such file$"):
        read_decompressed(missing)
    with pytest.raises(InputError, match="is a directory, expected the log file"):
        read_log(tmp_path)
    with pytest.raises(TraceError, match=r"is a directory, expected a snapshot file \(\.pickle"):
        read_decompressed(tmp_path)


def test_reads_the_bytes(tmp_path):
    f = tmp_path / "x.log"
    f.write_bytes(b"CUDA out of memory\n")
    assert read_input_bytes(f, expected="x") == b"CUDA out of memory\n"
    assert read_log(f).strip() == "CUDA out of memory"
