"""The MIG collector's spec: its flag, factory and families."""

from __future__ import annotations

from exporter.collectors.mig.families import mig_families
from exporter.collectors.mig.reading import MigCollector
from exporter.collectors.registry import CollectorSpec, NoSettings

SPEC = CollectorSpec(
    name="mig",
    help="MIG mode of each GPU, and each MIG instance's identity, profile and memory",
    default=True,
    factory=lambda settings, context: MigCollector(context),
    families=mig_families,
    settings=NoSettings,
)
