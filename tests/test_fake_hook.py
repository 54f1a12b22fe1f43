"""The fake NVML hooks pynvml's module globals; these tests fail loudly if that breaks."""

from __future__ import annotations

import pynvml
import pytest

from exporter.gpu import catalogue
from exporter.gpu import fields as fi
from exporter.gpu.backend import NvmlBackend
from exporter.gpu.device_read import read_device
from exporter.gpu.reading import read_gpu, read_identity
from exporter.sim import fake
from exporter.sim.fake_fields import FAULT_FIELDS
from exporter.sim.fake_model import ModelValues
from exporter.sim.symbols import SYMBOLS, WAITING


def test_hook_globals_exist_in_this_nvidia_ml_py():
    fake.check_hook()  # raises FakeHookError naming what changed
    assert pynvml.nvmlLib is None, "nothing may leave a library loaded between tests"


def test_install_routes_pynvml_calls_through_fake(fake_nvml):
    pynvml.nvmlInit()
    assert pynvml.nvmlLib is fake_nvml
    assert pynvml.nvmlDeviceGetCount() == 8
    assert "nvmlInitWithFlags" in fake_nvml.looked_up
    assert "nvmlDeviceGetCount_v2" in fake_nvml.looked_up
    pynvml.nvmlShutdown()


def test_uninstall_leaves_pynvml_unloaded(training, clock):
    with fake.installed(training, clock, costs=None):
        pynvml.nvmlInit()
        pynvml.nvmlDeviceGetCount()
    assert pynvml.nvmlLib is None
    assert pynvml._nvmlGetFunctionPointer_cache == {}
    assert pynvml._nvmlLib_refcount == 0


def test_without_fake_or_driver_nvml_init_fails_with_library_not_found():
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()


def test_unknown_symbol_raises_function_not_found(fake_nvml):
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, pynvml.c_nvmlGpuFabricInfo_t())
    assert "nvmlDeviceGetGpuFabricInfo" in fake_nvml.missing


def test_calls_before_init_are_uninitialized(fake_nvml):
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_every_symbol_the_exporter_uses_is_served(fake_nvml, clock):
    backend = NvmlBackend()
    count = backend.open()
    clock.advance(1)
    for gpu in range(count):
        ident = read_identity(backend, gpu)
        assert ident is not None
        state = read_gpu(backend, gpu, clock(), catalogue.CADENCES)
        assert state is not None
        read_device(backend, gpu, ident.nvlinks, clock(), state.values)
        assert len(backend.samples(gpu, fi.TOTAL_POWER_SAMPLES, 0)[0]) > 0
        assert backend.fields(gpu, [fi.POWER_INSTANT])
    assert fake_nvml.missing == set()
    errors = {call for call, _ in backend.errors.totals()}
    # H100 SXM has no fan, and Hopper retired pages for row remapping: those are the
    # values the training scenario does not support.
    assert errors == {"nvmlDeviceGetFanSpeed", "nvmlDeviceGetFieldValues(RETIRED_SBE)",
                      "nvmlDeviceGetFieldValues(RETIRED_DBE)",
                      "nvmlDeviceGetFieldValues(RETIRED_PENDING)"}
    backend.close()


def test_the_symbol_list_scenarios_check_calls_against_is_the_fakes():
    """A scenario's fault names its call from sim/symbols.py: a symbol the fake answers
    but the list lacks would be refused, one it lists but the fake lacks never fires."""
    served = {name[1:] for name in dir(fake.FakeNvmlLibrary) if name.startswith("_nvml")}
    assert served == SYMBOLS
    assert WAITING <= SYMBOLS


def test_the_fake_models_every_catalogue_value():
    """A catalogue entry the fake cannot answer would leave a metric no test ever sees (the
    memory errors are answered from the scenario's faults)."""
    missing = [v.key for v in catalogue.CATALOGUE
               if not hasattr(ModelValues, f"_model_{v.key}")
               and not (isinstance(v.nvml, catalogue.Field) and v.nvml.id in FAULT_FIELDS)]
    assert missing == []


def test_refuses_to_replace_a_real_library(training, clock, monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlLib", object())
    with pytest.raises(RuntimeError, match="real NVML"):
        fake.install(fake.FakeNvmlLibrary(training, clock, costs=None))


def test_check_hook_reports_a_changed_release(monkeypatch):
    monkeypatch.delattr(pynvml, "_nvmlGetFunctionPointer_cache")
    with pytest.raises(fake.FakeHookError, match="changed how it loads"):
        fake.check_hook()
