"""The GPU catalogue (exporter/gpu/catalogue.py): its entries carry their family's
declaration, the health read takes its memory-error and per-link fields from it, and an
entry whose label values do not fit its family is refused."""

from __future__ import annotations

import pytest

from exporter.families import Family
from exporter.gpu import catalogue
from exporter.gpu import fields as fi
from exporter.gpu.backend import NvmlBackend
from exporter.gpu.catalogue import SLOW, Field, GpuValue
from exporter.gpu.device_read import ALL_LINKS, NvlinkReads, device_read_requests, read_device
from exporter.gpu.reading import read_gpu
from exporter.metrics import gpu, gpu_hardware


@pytest.mark.parametrize(("family", "labels", "per_link", "problem"), [
    (catalogue.ECC, ("corrected",), False, "label values"),
    (catalogue.REMAP_PENDING, ("x",), False, "label values"),
    (catalogue.ECC, ("corrected", "volatile"), True, "go on with link"),
    (Family("x", "gauge", "X.", ("uuid", "gpu"), source="t"), (), False, "begin with"),
])
def test_an_entry_that_does_not_fit_its_family_is_refused(family, labels, per_link, problem):
    with pytest.raises(ValueError, match=problem):
        GpuValue("x", Field(1), 1, SLOW, family, labels=labels, per_link=per_link)


def test_every_catalogue_family_is_declared_under_one_heading():
    families = [*catalogue.DECLARED, *(e.family for e in catalogue.PER_LINK)]
    shown = [*gpu.DECLARED, *gpu_hardware.DECLARED]
    for family in families:
        assert shown.count(family) == 1, family.name


def test_the_health_read_asks_every_per_link_entry_for_each_link():
    requests = device_read_requests(2)
    for entry in catalogue.PER_LINK:
        assert isinstance(entry.nvml, Field)
        assert {(entry.nvml.id, 0), (entry.nvml.id, 1)} <= set(requests), entry.key
    summed = device_read_requests(2, NvlinkReads(traffic_per_link=False))
    assert (fi.NVLINK_TX, ALL_LINKS) in summed and (fi.NVLINK_TX, 0) not in summed


def test_the_memory_errors_are_the_sweeps_and_not_asked_again(fake_nvml, clock):
    """The health read takes the memory errors from the sweep's values (keyed by the
    catalogue entries, by their label values), and asks NVML only for the rest."""
    memory = {e.nvml.id for f in catalogue.MEMORY_ERRORS for e in catalogue.FAMILIES[f]
              if isinstance(e.nvml, Field)}
    assert memory >= {fi.ECC_SBE_VOL_TOTAL, fi.REMAPPED_FAILURE}
    assert not memory & {r if isinstance(r, int) else r[0] for r in device_read_requests(18)}
    backend = NvmlBackend()
    backend.open()
    values = {"ecc_corrected_volatile": 3.0, "ecc_uncorrected_aggregate": 1.0,
              "remapped_rows_correctable": 2.0, "row_remap_pending": 1.0}
    health = read_device(backend, 0, 0, clock(), values)
    assert health is not None
    assert health.ecc_errors == {("corrected", "volatile"): 3.0,
                                 ("uncorrected", "aggregate"): 1.0}
    assert health.remapped_rows == {"correctable": 2.0}
    assert (health.row_remap_pending, health.row_remap_failure) == (1.0, None)
    # the sweep's health-interval values carry every memory entry (a healthy GPU: zeros)
    swept = read_gpu(backend, 0, clock(), (SLOW,))
    assert swept is not None
    alone = read_device(backend, 0, 0, clock(), swept.values)
    assert alone is not None and alone.ecc_errors[("uncorrected", "volatile")] == 0.0
