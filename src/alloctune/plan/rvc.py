"""RVC's own memory presets set against what a plan says fits.

RVC (configs/config.py, `Config.device_config`) picks its chunking from the card:
`gpu_mem = int(total_memory / 2**30 + 0.4)`; at most 4 GB -> x_pad/x_query/x_center/x_max
= 1/5/30/32 s, else fp16 -> 3/10/60/65, fp32 -> 1/6/38/41 (`../shared/rvc-workload.md`
§1.2; the workload's copy is `alloctune.workloads.chunking`, not imported here because the
core stays free of the workloads' dependencies). The longest piece RVC converts is a middle
chunk: x_center + 2*x_query seconds of audio plus x_pad of context on both sides and one
10 ms frame.

A plan over recordings of one unsplit file of S seconds (`python -m alloctune.workloads.rvc
--count 1 --min-seconds S --max-seconds S`) answers the longest S that fits; the chunk the
GPU held was S + 2*x_pad of the recording's preset. Where RVC's preset chunk is longer than
that, the card OOMs on long files, and the x_center that would fit is shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from alloctune.plan.result import PlanResult
from alloctune.units import GiB

PRESETS = {"fp16": (3.0, 10.0, 60.0, 65.0), "fp32": (1.0, 6.0, 38.0, 41.0), "low": (1.0, 5.0, 30.0, 32.0)}
FRAME_S = 0.01


def preset_for_card(total_memory: int, is_half: bool = True) -> str:
    gpu_mem = int(total_memory / GiB + 0.4)
    if gpu_mem <= 4:
        return "low"
    return "fp16" if is_half else "fp32"


def longest_chunk_s(preset: str) -> float:
    x_pad, x_query, x_center, _ = PRESETS[preset]
    return x_center + 2 * x_query + 2 * x_pad + FRAME_S


@dataclass(frozen=True)
class RvcRow:
    conf: str
    target: str
    preset: str  # the preset RVC picks on this card (fp16 unless --rvc-fp32)
    preset_chunk_s: float  # the longest chunk that preset makes
    fits_audio_s: float | None  # longest unsplit audio that completes (plan's answer)
    fits_chunk_s: float | None  # the chunk that audio made (plus the recording's padding)
    verdict: str
    x_center_fit: float | None  # the largest whole-second x_center whose chunks fit, if the preset does not

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def rvc_rows(result: PlanResult, recorded_pad_s: float = 3.0, is_half: bool = True) -> list[RvcRow]:
    rows = []
    for s in result.settings:
        for item in s.largest:
            t = item.target
            preset = preset_for_card(t.bytes, is_half) if t.kind == "card" else ("fp16" if is_half else "fp32")
            x_pad, x_query, _, _ = PRESETS[preset]
            need = longest_chunk_s(preset)
            if item.largest is None:
                rows.append(RvcRow(s.conf, t.label, preset, need, None, None, "nothing fits", None))
                continue
            audio = float(item.largest)
            chunk = audio + 2 * recorded_pad_s + FRAME_S
            if item.first_failing is None:
                verdict = f"fits (all searched: >= {chunk:g} s)"
                x_fit = None
            elif chunk >= need:
                verdict = "preset fits"
                x_fit = None
            else:
                x_fit = math.floor(chunk - 2 * x_pad - 2 * x_query - FRAME_S)
                verdict = "preset OOMs on long files" + (
                    f": x_center <= {x_fit} s fits" if x_fit >= 1 else ": even 1 s centres do not fit"
                )
            rows.append(RvcRow(s.conf, t.label, preset, need, audio, chunk, verdict, x_fit if x_fit and x_fit >= 1 else None))
    return rows
