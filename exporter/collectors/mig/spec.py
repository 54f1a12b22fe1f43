"""The mig collector's spec: its flag, options, factory and families."""

from __future__ import annotations

from typing import Any

from exporter.collectors.mig.families import mig_families
from exporter.collectors.mig.reading import MigSource
from exporter.collectors.registry import CollectorSpec
from exporter.sampling.collector_api import CollectorContext


def _make(config: Any, context: CollectorContext) -> MigSource:
    return MigSource(context)


SPEC = CollectorSpec(
    name="mig",
    help="MIG mode of each GPU, and each MIG instance's identity, profile and memory",
    default=True,
    factory=_make,
    families=mig_families,
)
