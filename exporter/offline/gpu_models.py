"""Which GPU models report power.draw (NVML's GetPowerUsage) as a ~1 s average.

NVML's documentation: "On Ampere (except GA100) or newer GPUs, the API returns
power averaged over 1 sec interval"; older boards, and GA100 (A100, A30, A800),
return the instantaneous draw.  nvidia-smi's ``name`` column says which board a
log came from.  Order matters: the first pattern that matches decides (A100
before the other Ampere boards, "RTX 6000 Ada" before "Quadro RTX 6000").
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    generation: str
    averages_power_draw: bool


_TABLE: tuple[tuple[str, GpuModel], ...] = (
    (r"\bA100\b|\bA800\b|\bA30\b|\bPG506\b", GpuModel("Ampere GA100", False)),
    (r"\b(?:GH|H)(?:100|200|800|20)\b|\bH100L\b|\bH100 NVL\b", GpuModel("Hopper", True)),
    (r"\bG?B(?:100|200|300)\b|\bB40\b|RTX 50\d0|RTX PRO \d000|Blackwell",
     GpuModel("Blackwell", True)),
    (r"\bL4\b|\bL40S?\b|\bL20\b|RTX 40\d0|Ada Generation|RTX \d000 Ada",
     GpuModel("Ada Lovelace", True)),
    (r"\bA10G?\b|\bA10M\b|\bA16\b|\bA2\b|\bA40\b|RTX A\d{3,4}\b|RTX 30\d0|\bA\d000\b",
     GpuModel("Ampere GA10x", True)),
    (r"V100|TITAN V\b|Quadro GV100|\bGV100\b", GpuModel("Volta", False)),
    (r"\bT4\b|RTX 20\d0|Quadro RTX|TITAN RTX|GTX 16\d0|\bT\d{3,4}\b", GpuModel("Turing", False)),
    (r"P100|\bP40\b|\bP4\b|\bP6\b|GTX 10\d0|TITAN Xp?\b|Quadro P\d", GpuModel("Pascal", False)),
    (r"\bM\d{1,2}\b|GTX 9\d0|Quadro M\d|TITAN X\b", GpuModel("Maxwell", False)),
    (r"\bK\d{2}m?\b|GTX 7\d0|Quadro K\d", GpuModel("Kepler", False)),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), m) for p, m in _TABLE)


def gpu_model(name: str) -> GpuModel | None:
    """The generation of a GPU by its marketing name, or None when unknown."""
    for pattern, model in _COMPILED:
        if pattern.search(name):
            return model
    return None
