"""The profile of each family not declared yet: the families of the modules that still
build theirs by hand, whose rows in docs/metrics.md are still written by hand too (their
labels are read from those rows): exporter/metrics/{gpu,gpu_health}.py with
exporter/gpu/catalogue.py.

A remainder of the move to declarations (exporter/families.py): it shrinks to nothing as
each producing module declares its families, and goes then. Add nothing here: declare a
new family beside its code instead. scripts/build_metrics_docs.py merges this table with
the declarations into exporter/metrics/family_table.py.

Moving a module to declarations (exporter/metrics/self_metrics.py and
exporter/collectors/host/families.py show how):
1. Declare each of its families as a module-level `Family` beside the code, help and
   labels exactly as served today, unit, source and description copied from its row in
   docs/metrics.md (`doc=` only where the description says more than the help), the
   profile from this table; list them in a module-level `DECLARED`, in the docs' order.
2. Build each family from its declaration (`.gauge()`, `.counter()`, `.info()`,
   `Rows.of()`, `counts_of()` for a collector's error counts), never by name and help.
3. Add the module to `SECTIONS` in scripts/build_metrics_docs.py under its heading, and
   put the heading's table in docs/metrics.md between `<!-- families: KEY -->` and
   `<!-- end families -->` (a table is generated whole: the modules of one heading move
   together).
4. Delete its families here; run `.venv/bin/python scripts/build_metrics_docs.py`; the
   diff of docs/metrics.md should show no row changed.
5. Run tests/test_family_declarations.py, test_golden_metrics.py (unchanged),
   test_docs_metrics.py and test_selection.py.
"""

from __future__ import annotations

from exporter.families import FULL, MINIMAL, STANDARD

UNDECLARED_PROFILES: dict[str, str] = {
    "gpu_clock_event_active": STANDARD,
    "gpu_clock_event_driver_seconds_total": FULL,
    "gpu_clock_event_seconds_total": STANDARD,
    "gpu_decoder_utilization_ratio": FULL,
    "gpu_ecc_errors_total": MINIMAL,
    "gpu_encoder_utilization_ratio": FULL,
    "gpu_energy_joules_total": MINIMAL,
    "gpu_expected_devices": MINIMAL,
    "gpu_fan_speed_ratio": STANDARD,
    "gpu_info": MINIMAL,
    "gpu_memory_clock_hertz": STANDARD,
    "gpu_memory_free_bytes": STANDARD,
    "gpu_memory_reserved_bytes": FULL,
    "gpu_memory_temperature_celsius": STANDARD,
    "gpu_memory_total_bytes": MINIMAL,
    "gpu_memory_used_bytes": MINIMAL,
    "gpu_memory_utilization_ratio": STANDARD,
    "gpu_nvlink_errors_total": MINIMAL,
    "gpu_nvlink_link_up": FULL,
    "gpu_nvlink_links_active": MINIMAL,
    "gpu_nvlink_links_expected": MINIMAL,
    "gpu_nvlink_receive_bytes_total": STANDARD,
    "gpu_nvlink_transmit_bytes_total": STANDARD,
    "gpu_pcie_link_generation": STANDARD,
    "gpu_pcie_link_max_generation": STANDARD,
    "gpu_pcie_link_max_width": STANDARD,
    "gpu_pcie_link_width": STANDARD,
    "gpu_pcie_receive_bytes_total": STANDARD,
    "gpu_pcie_replays_total": MINIMAL,
    "gpu_pcie_transmit_bytes_total": STANDARD,
    "gpu_performance_state": STANDARD,
    "gpu_power_average_watts": STANDARD,
    "gpu_power_default_limit_watts": STANDARD,
    "gpu_power_limit_watts": MINIMAL,
    "gpu_power_watts": MINIMAL,
    "gpu_recovery_action": MINIMAL,
    "gpu_remapped_rows_total": MINIMAL,
    "gpu_retired_pages_pending": STANDARD,
    "gpu_retired_pages_total": STANDARD,
    "gpu_row_remap_failure": MINIMAL,
    "gpu_row_remap_pending": MINIMAL,
    "gpu_sm_clock_hertz": STANDARD,
    "gpu_sm_clock_max_hertz": STANDARD,
    "gpu_temperature_celsius": MINIMAL,
    "gpu_up": MINIMAL,
    "gpu_utilization_ratio": MINIMAL,
    "gpu_xid_errors_total": MINIMAL,
    "gpu_xid_last_seen_timestamp_seconds": MINIMAL,
}
