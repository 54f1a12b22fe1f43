"""What `analyze` was asked, as one typed object: the trace and how to read it (the
command's own inputs, which are no settings), and the settings of the analyses, the same
`PowerSettings` and `StragglerSettings` objects `run` builds, from their declarations
(exporter/sampling/settings.py). The offline analyses read this object, never the
command line's namespace."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TypeVar

from exporter.options import ANALYZE, Option, build, inputs_of, options_of, resolve
from exporter.sampling.settings import PowerSettings, StragglerSettings

S = TypeVar("S")


@dataclass(frozen=True)
class AnalyzeRequest:
    file: str = ""  # the trace
    power: PowerSettings = field(default_factory=PowerSettings)
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)
    gpus: int | None = None  # GPUs per poll, for nvidia-smi logs without an index column
    format: str = "text"  # of the report: text or json
    tdp: float | None = None  # power limit per GPU where the trace records none
    step: float | None = None  # step-scale window advance (None: the window / 3)
    max_hz: float | None = None  # cap on the observable band (None: from the evidence)
    power_averaging: float | None = None  # seconds; 0: instantaneous; None: decide

    @classmethod
    def of(cls, given: AnalyzeRequest | argparse.Namespace) -> AnalyzeRequest:
        """From analyze's parsed flags (a request passes as it is)."""
        if isinstance(given, AnalyzeRequest):
            return given
        values = resolve(given, ANALYZE, analyze_options().values())
        return inputs_of(cls, given, power=_settings(PowerSettings, values),
                         stragglers=_settings(StragglerSettings, values))


def analyze_options() -> dict[str, Option]:
    """The settings `analyze` takes as flags (one declaration, one default), by flag."""
    options = [*options_of(PowerSettings), *options_of(StragglerSettings)]
    return {flag: o for o in options
            if ANALYZE in o.commands and (flag := o.flag_for(ANALYZE)) is not None}


def _settings(cls: type[S], values: dict[str, object]) -> S:
    keys = {o.key for o in options_of(cls)}
    return build(cls, {k: v for k, v in values.items() if k in keys})
