"""dcgm-exporter compatibility (--metrics.compat dcgm-exporter): every field of its
default counters file, by name, TYPE, unit and label set, against our own families'
values converted; MIG, Kubernetes and Slurm labels; XIDs and the health verdict.

The expectations here are written from dcgm-exporter's files and DCGM's documented units,
apart from the table the code serves (exporter/metrics/compat/dcgm_fields.csv): a wrong scale or
a field left out of the table fails here.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from exporter.collectors.jobs.reading import JobsReading
from exporter.collectors.kubernetes.reading import KubernetesReading, PodDevice
from exporter.health.model import (
    FAILED,
    NOT_APPLICABLE,
    OK,
    UNKNOWN,
    WARNING,
    CheckResult,
    NodeHealth,
    Verdict,
    unknown_health,
)
from exporter.metrics.compat import dcgm
from exporter.sampling.snapshot import CollectorResult, XidRecord
from exporter.sim.scenarios import Workload
from tests.tools import families, http_get, make_snapshot

MIB = 2.0 ** -20

# dcgm-exporter's etc/default-counters.csv (main, 7ad58324; the same rows as its 4.8.3
# release's): every uncommented field with its TYPE, the unit its value is in (DCGM's,
# as its help text or DCGM's field documentation states it; "-": a count or a code) and
# how its value follows from ours: (our sample name, our labels that pick the series,
# factor into DCGM's unit). None: not served here. That file declares
# DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL a gauge (its releases before 4.x declared counter).
DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "MHz", ("gpu_sm_clock_hertz", {}, 1e-6)),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "MHz", ("gpu_memory_clock_hertz", {}, 1e-6)),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "C", ("gpu_memory_temperature_celsius", {}, 1.0)),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "C", ("gpu_temperature_celsius", {}, 1.0)),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "W", ("gpu_power_average_watts", {}, 1.0)),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
        "counter", "mJ", ("gpu_energy_joules_total", {}, 1000.0)),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "-", ("gpu_pcie_replays_total", {}, 1.0)),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "%", ("gpu_utilization_ratio", {}, 100.0)),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "%", ("gpu_memory_utilization_ratio", {}, 100.0)),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "%", ("gpu_encoder_utilization_ratio", {}, 100.0)),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "%", ("gpu_decoder_utilization_ratio", {}, 100.0)),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "XID", "xid"),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "MiB", ("gpu_memory_free_bytes", {}, MIB)),
    "DCGM_FI_DEV_FB_USED": ("gauge", "MiB", "fb_used"),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "MiB", ("gpu_memory_reserved_bytes", {}, MIB)),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("gauge", "KiB", "nvlink"),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", "-", None),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "counter", "-", ("gpu_remapped_rows_total", {"type": "uncorrectable"}, 1.0)),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (
        "counter", "-", ("gpu_remapped_rows_total", {"type": "correctable"}, 1.0)),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "-", ("gpu_row_remap_failure", {}, 1.0)),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (
        "gauge", "ratio", ("gpu_graphics_engine_active_ratio", {}, 1.0)),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (
        "gauge", "ratio", ("gpu_tensor_active_ratio", {}, 1.0)),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "ratio", ("gpu_dram_active_ratio", {}, 1.0)),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", "B/s", "pcie_tx"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", "B/s", "pcie_rx"),
}
#: the file's one `label` row: a label on every sample, not a family
DEFAULT_LABELS = {"DCGM_FI_DRIVER_VERSION"}
#: default fields not served, each because NVML cannot give it on this kind of node
NOT_FROM_NVML = {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}  # a vGPU guest's license: no vGPU here
# the label set of every sample of a whole GPU (dcgm-exporter's GPU template)
GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
              "DCGM_FI_DRIVER_VERSION"}
# labels one family adds to its device's set, as dcgm-exporter does
FAMILY_LABELS = {"DCGM_FI_DEV_XID_ERRORS": {"err_code", "err_msg"},
                 "DCGM_EXP_XID_ERRORS_COUNT": {"xid", "window_size_in_ms"},
                 "DCGM_EXP_XID_ERRORS_TOTAL": {"xid"},
                 "DCGM_EXP_GPU_HEALTH_STATUS": {"health_watch", "health_error_code"}}


def compat_families(body: bytes) -> dict:
    return {name: f for name, f in families(body).items() if name.startswith("DCGM_")}


def ours(fams: dict, sample: str, gpu: str, where: dict) -> float:
    """Our sample's value for a GPU, summed over the labels `where` does not fix (links)."""
    family = fams[sample.removesuffix("_total")]
    got = [s.value for s in family.samples if s.name == sample and s.labels["gpu"] == gpu
           and all(s.labels.get(k) == v for k, v in where.items())]
    assert got, (sample, gpu, where)
    return sum(got)


@pytest.fixture(scope="module")
def training(module_exporter):
    """A fake H100 node in compat mode, every family of ours served, after 40 s."""
    exp = module_exporter.start(manual=True, metrics_profile="full",
                                metrics_compat="dcgm-exporter")
    exp.sampler.advance(40)
    _, body = http_get(exp.port)
    return body


def test_every_default_counter_has_its_name_type_unit_and_value(training):
    fams = families(training)
    compat = compat_families(training)
    served = {f.name for f in dcgm.FIELDS if f.served and f.type != "label"}
    for name, (kind, unit, how) in DEFAULT_COUNTERS.items():
        field = dcgm.BY_NAME[name]
        assert field.list == "default" and field.type == kind, name
        assert field.unit == unit, name
        if how is None:
            assert name in NOT_FROM_NVML, name  # every default field NVML can give is served
            assert name not in compat and name not in served, name
            continue
        assert compat[name].type == kind, name
        assert compat[name].documentation == field.help, name
        if "(in " in field.help:  # the unit its help states is the unit served
            assert f"(in {field.unit})" in field.help, name
        samples = {s.labels["gpu"]: s for s in compat[name].samples}
        assert set(samples) == {str(g) for g in range(8)}, name
        for gpu, sample in samples.items():
            if how == "xid":
                assert sample.value == 0 and sample.labels["err_code"] == "0"
                continue
            if how == "fb_used":
                want = (ours(fams, "gpu_memory_used_bytes", gpu, {})
                        - ours(fams, "gpu_memory_reserved_bytes", gpu, {})) * MIB
            elif how == "nvlink":
                want = (ours(fams, "gpu_nvlink_transmit_bytes_total", gpu, {})
                        + ours(fams, "gpu_nvlink_receive_bytes_total", gpu, {})) / 1024
            elif how in ("pcie_tx", "pcie_rx"):  # bytes per second: the fake's PCIe rate
                share = 0.55 if how == "pcie_tx" else 0.45
                want = Workload().pcie_bytes_per_second * share
                assert math.isclose(sample.value, want, rel_tol=1e-3), (name, gpu)
                continue
            else:
                sample_name, where, factor = how
                want = ours(fams, sample_name, gpu, where) * factor
            assert math.isclose(sample.value, want, rel_tol=1e-9), (name, gpu)
    # the table's default list is the file's, no more
    assert {f.name for f in dcgm.FIELDS if f.list == "default" and f.type != "label"} == set(
        DEFAULT_COUNTERS)
    assert {f.name for f in dcgm.FIELDS if f.list == "default" and f.type == "label"} == (
        DEFAULT_LABELS)


def test_every_sample_of_a_gpu_has_dcgm_exporters_labels(training):
    info = {s.labels["gpu"]: s.labels for s in families(training)["gpu_info"].samples}
    by_gpu: dict[str, set[frozenset]] = defaultdict(set)
    for name, family in compat_families(training).items():
        for sample in family.samples:
            labels = sample.labels
            gpu = labels["gpu"]
            assert labels["UUID"] == info[gpu]["uuid"]
            assert labels["pci_bus_id"] == info[gpu]["pci_bus_id"]
            assert labels["modelName"] == info[gpu]["name"]
            assert labels["device"] == f"nvidia{gpu}"
            assert labels["DCGM_FI_DRIVER_VERSION"] == info[gpu]["driver_version"]
            assert labels["Hostname"] == dcgm.node_hostname()
            assert not {"GPU_I_PROFILE", "GPU_I_ID"} & set(labels), name  # no MIG here
            by_gpu[gpu].add(frozenset(set(labels) - FAMILY_LABELS.get(name, set())))
    # one label set per GPU: two DCGM families join without on()
    assert by_gpu and all(sets == {frozenset(GPU_LABELS)} for sets in by_gpu.values())


def test_the_extras_convert_as_dcgm_states_them(training):
    fams, compat = families(training), compat_families(training)
    checks = {  # name: (our sample, labels, factor into DCGM's unit)
        "DCGM_FI_DEV_FB_TOTAL": ("gpu_memory_total_bytes", {}, MIB),
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gpu_power_limit_watts", {}, 1.0),
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": ("gpu_power_max_limit_watts", {}, 1.0),
        "DCGM_FI_DEV_MAX_SM_CLOCK": ("gpu_sm_clock_max_hertz", {}, 1e-6),
        "DCGM_FI_DEV_POWER_VIOLATION": (  # ns, as the counters files say
            "gpu_clock_event_driver_seconds_total", {"reason": "sw_power_cap"}, 1e9),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (
            "gpu_ecc_errors_total", {"type": "uncorrected", "scope": "volatile"}, 1.0),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (
            "gpu_nvlink_errors_total", {"type": "crc_flit"}, 1.0),
        "DCGM_FI_PROF_SM_ACTIVE": ("gpu_sm_active_ratio", {}, 1.0),
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("gpu_pcie_transmit_bytes_total", {}, 1 / 1024),
    }
    for name, (sample, where, factor) in checks.items():
        for s in compat[name].samples:
            want = ours(fams, sample, s.labels["gpu"], where) * factor
            assert math.isclose(s.value, want, rel_tol=1e-9), name
    masks = {s.labels["gpu"]: s.value
             for s in compat["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].samples}
    assert all(float(int(v)) == v and v >= 0 for v in masks.values())


def test_mig_labels_only_on_mig_instances(running_exporter):
    exp = running_exporter.start(manual=True, scenario="mig", metrics_compat="dcgm-exporter")
    exp.sampler.advance(40)
    _, body = http_get(exp.port)
    compat = compat_families(body)
    instances = set()
    label_sets: dict[tuple, set[frozenset]] = defaultdict(set)
    for name, family in compat.items():
        for s in family.samples:
            labels = s.labels
            mig = {"GPU_I_PROFILE", "GPU_I_ID"} & set(labels)
            assert mig in (set(), {"GPU_I_PROFILE", "GPU_I_ID"})  # both, or absent
            if mig:
                assert labels["gpu"] in ("0", "1")  # the MIG GPUs
                assert name.startswith("DCGM_FI_PROF_") or name.startswith("DCGM_FI_DEV_FB_"), (
                    name)
                instances.add((labels["gpu"], labels["GPU_I_ID"], labels["GPU_I_PROFILE"]))
            key = (labels["gpu"], labels.get("GPU_I_ID"))
            label_sets[key].add(frozenset(set(labels) - FAMILY_LABELS.get(name, set())))
    assert ("0", "1", "3g.71gb") in instances and ("0", "13", "1g.18gb") in instances
    assert ("1", "2", "3g.71gb") in instances
    assert all(len(sets) == 1 for sets in label_sets.values()), label_sets
    # the whole GPUs' samples carry no MIG label
    whole = [s for s in compat["DCGM_FI_DEV_GPU_TEMP"].samples]
    assert len(whole) == 8 and not any("GPU_I_ID" in s.labels for s in whole)
    # each instance's framebuffer, in MiB, as our gpu_mig_memory_* say
    fams = families(body)
    ours = {(s.labels["gpu"], s.labels["gpu_instance"]): s.value
            for s in fams["gpu_mig_memory_used_bytes"].samples}
    used = {(s.labels["gpu"], s.labels["GPU_I_ID"]): s.value
            for s in compat["DCGM_FI_DEV_FB_USED"].samples if "GPU_I_ID" in s.labels}
    assert used and used.keys() == ours.keys()
    assert all(math.isclose(used[k], ours[k] * MIB) for k in used)
    free = {(s.labels["gpu"], s.labels["GPU_I_ID"]): s.value
            for s in compat["DCGM_FI_DEV_FB_FREE"].samples if "GPU_I_ID" in s.labels}
    total = {(s.labels["gpu"], s.labels["GPU_I_ID"]): s.value
             for s in compat["DCGM_FI_DEV_FB_TOTAL"].samples if "GPU_I_ID" in s.labels}
    assert all(math.isclose(free[k] + used[k], total[k]) for k in used)


def test_xid_errors_carry_the_last_code_with_err_code_and_err_msg(running_exporter):
    exp = running_exporter.start(manual=True, scenario="xid", metrics_compat="dcgm-exporter")
    exp.sampler.advance(30)
    _, body = http_get(exp.port)
    compat = compat_families(body)
    last = {s.labels["gpu"]: s for s in compat["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert last["2"].value == 48 and last["2"].labels["err_code"] == "48"
    assert last["2"].labels["err_msg"] == "Double Bit ECC Error"
    assert last["6"].labels["err_code"] == "999"
    assert last["6"].labels["err_msg"] == dcgm.UNKNOWN_XID
    assert last["0"].value == 0 and last["0"].labels["err_msg"] == "No Error"
    totals = {(s.labels["gpu"], s.labels["xid"]): s.value
              for s in compat["DCGM_EXP_XID_ERRORS_TOTAL"].samples}
    assert totals[("2", "48")] == 2 and totals[("2", "94")] == 1


def test_pods_and_jobs_label_the_devices_that_hold_them():
    k8s = KubernetesReading(devices=(
        PodDevice(0, "GPU-00000000", None, "ml", "trainer-0", "main"),
        PodDevice(1, "GPU-00000001", None, "ml", "trainer-1", "main")), up=True)
    jobs = JobsReading(jobs={1: ("4242",)}, skipped_total={})
    snap = make_snapshot(3, collectors={
        "kubernetes": CollectorResult(k8s, 0.0, True, 0),
        "jobs": CollectorResult(jobs, 0.0, True, 0)})
    by_gpu = {d.gpu: d.labels for d in dcgm.DcgmCompat("n1").devices(snap)}
    assert 'namespace="ml"' in by_gpu[0] and 'pod="trainer-0"' in by_gpu[0]
    assert 'container="main"' in by_gpu[0] and "hpc_job" not in by_gpu[0]
    assert 'hpc_job="4242"' in by_gpu[1] and 'pod="trainer-1"' in by_gpu[1]
    # a GPU no container holds: empty, as dcgm-exporter writes it, so a scrape with
    # honor_labels never gives it the exporter's own pod (the target's label)
    for label in ("namespace", "pod", "container"):
        assert f'{label}=""' in by_gpu[2], label
    assert "hpc_job" not in by_gpu[2]  # absent, not empty
    # without the Kubernetes mapping: no pod labels at all
    (plain,) = dcgm.DcgmCompat("n1").devices(make_snapshot(1))
    assert "pod=" not in plain.labels and "namespace=" not in plain.labels


def test_hostname_label_is_spelt_as_asked():
    snap = make_snapshot(1)
    (device,) = dcgm.DcgmCompat("n1", "hostname").devices(snap)
    assert 'hostname="n1"' in device.labels and "Hostname" not in device.labels
    with pytest.raises(ValueError):
        dcgm.DcgmCompat("n1", "HOSTNAME")


def test_xid_count_is_the_windows_increase():
    compat = dcgm.DcgmCompat("n1")

    def count(time: float, n: int, last: float) -> float:
        snap = make_snapshot(1, time=time, xids={(0, 79): XidRecord(n, last)})
        text = compat.render(snap, unknown_health(snap.time, 1)).decode()
        (line,) = [x for x in text.splitlines() if x.startswith("DCGM_EXP_XID_ERRORS_COUNT{")]
        assert 'window_size_in_ms="300000"' in line and 'xid="79"' in line
        return float(line.rsplit(" ", 1)[1])

    assert count(1000.0, 2, 990.0) == 2  # the first render: its XIDs are in the window
    assert count(1200.0, 3, 1150.0) == 3
    assert count(1400.0, 3, 1150.0) == 1  # 1000's count (2) is older than the window
    assert count(1800.0, 3, 1150.0) == 0


def test_health_status_per_watch_from_our_verdict():
    def check(name: str, state: str) -> CheckResult:
        return CheckResult(name, state, None, None, "", 0.0)

    verdict = Verdict(FAILED, "reset_gpu", "", (
        check("ecc_uncorrected", FAILED), check("pcie_replays", WARNING), check("xid", OK)))
    health = NodeHealth(1.0, verdict, {0: verdict})
    text = dcgm.DcgmCompat("n1").render(make_snapshot(1), health).decode()
    rows = {line.split('health_watch="')[1].split('"')[0]: line
            for line in text.splitlines() if line.startswith("DCGM_EXP_GPU_HEALTH_STATUS{")}
    assert set(rows) == set(dcgm.HEALTH_WATCHES)
    assert rows["MEM"].endswith(" 20.0")
    assert 'health_error_code="DCGM_FR_VOLATILE_DBE_DETECTED"' in rows["MEM"]
    assert rows["PCIE"].endswith(" 10.0") and rows["DRIVER"].endswith(" 0.0")
    assert 'health_error_code="DCGM_FR_OK"' in rows["DRIVER"]


def _health_rows(health: NodeHealth, gpus: int = 1) -> dict[tuple[str, str], str]:
    text = dcgm.DcgmCompat("n1").render(make_snapshot(gpus), health).decode()
    return {(line.split('gpu="')[1].split('"')[0],
             line.split('health_watch="')[1].split('"')[0]): line
            for line in text.splitlines() if line.startswith("DCGM_EXP_GPU_HEALTH_STATUS{")}


def test_a_watch_not_yet_judged_is_not_served_as_a_pass():
    """A failed GPU whose memory checks are all unknown (the health read hung, say) serves
    no MEM status: dcgm-exporter's 0 would say it passed."""
    def check(name: str, state: str) -> CheckResult:
        return CheckResult(name, state, None, None, "", 0.0)

    verdict = Verdict(FAILED, "reset_gpu", "", (
        check("ecc_uncorrected", UNKNOWN), check("retired_pages", NOT_APPLICABLE),
        check("pcie_replays", OK), check("xid", FAILED), check("recovery_action", OK)))
    rows = {watch: line for (_, watch), line in
            _health_rows(NodeHealth(1.0, verdict, {0: verdict})).items()}
    assert "MEM" not in rows and rows["PCIE"].endswith(" 0.0")
    assert rows["DRIVER"].endswith(" 20.0")  # the XID failed it
    assert rows["PMU"].endswith(" 0.0")  # no check of ours maps to it: pass, as documented


def test_no_health_status_is_served_while_the_verdict_is_unknown():
    """Not yet judged is no pass, and dcgm-exporter documents no value for it: before the
    first judgement (the explicit unknown verdict), and for a GPU whose verdict is unknown
    while the others are judged, no watch is served at all, not even those no check of
    ours maps to (which read pass once the GPU is judged)."""
    def check(name: str, state: str) -> CheckResult:
        return CheckResult(name, state, None, None, "", 0.0)

    assert _health_rows(unknown_health(1.0, 2), gpus=2) == {}
    unknown = Verdict(UNKNOWN, "none", "GPU 1: thermal violation rate not known yet", (
        check("ecc_uncorrected", OK), check("pcie_replays", OK),
        check("thermal_violation", UNKNOWN)))
    ok = Verdict(OK, "none", "", (check("ecc_uncorrected", OK), check("pcie_replays", OK)))
    rows = _health_rows(NodeHealth(1.0, unknown, {0: ok, 1: unknown}), gpus=2)
    assert {gpu for gpu, _ in rows} == {"0"}
    assert {watch for _, watch in rows} == set(dcgm.HEALTH_WATCHES)
    assert all(line.endswith(" 0.0") for line in rows.values())


def test_every_health_check_maps_to_a_watch():
    from exporter.health.checks_board import CHECKS as BOARD
    from exporter.health.checks_gpu import CHECKS as GPU
    from exporter.health.checks_links import CHECKS as LINKS
    from exporter.health.checks_memory import CHECKS as MEMORY

    names = {c.name for c in (*BOARD, *GPU, *LINKS, *MEMORY)}
    assert names <= set(dcgm.HEALTH_CHECKS)
    assert {w for w, _ in dcgm.HEALTH_CHECKS.values()} <= set(dcgm.HEALTH_WATCHES)


def test_what_is_not_served_is_said_once_with_why():
    line = dcgm.summary(profiling=False, nvlink_traffic=False)
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS (the license of a vGPU" in line
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE (the profiling collector is off)" in line
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (NVLink traffic is not read" in line
    assert "\n" not in line
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in dcgm.summary()


def test_the_start_says_in_one_line_what_is_not_served(running_exporter, caplog):
    with caplog.at_level("INFO", logger="exporter.app"):
        running_exporter.start(manual=True, metrics_compat="dcgm-exporter",
                               collector_profiling=False)
    (line,) = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("metrics compat dcgm-exporter")]
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in line
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (the profiling collector is off)" in line


def test_compat_is_off_by_default(training, running_exporter):
    exp = running_exporter.start(manual=True)
    exp.sampler.advance(5)
    _, body = http_get(exp.port)
    assert b"DCGM_" not in body


def test_the_migration_page_lists_what_is_served(training):
    """docs/migrating-from-dcgm-exporter.md's table is generated from the served table,
    and says of each field what /metrics does: served (with its TYPE) or not."""
    import subprocess
    import sys

    from tests.tools import REPO

    script = REPO / "scripts" / "build_migration_docs.py"
    check = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout
    page = (REPO / "docs" / "migrating-from-dcgm-exporter.md").read_text()
    table = page.split("<!-- begin fields -->")[1].split("<!-- end fields -->")[0]
    rows = {line.split("`")[1]: line.split(" | ") for line in table.splitlines()
            if line.startswith("| `DCGM_")}
    served = compat_families(training)
    for name, family in served.items():
        assert rows[name][1] == family.type and rows[name][5] != "not served", name
    for name, cells in rows.items():
        if cells[5] == "not served":
            assert name not in served, name
            # no default field NVML can give is left out
            assert cells[4] != "yes" or name in NOT_FROM_NVML, name
    # served but absent here only where this node has nothing to say: an H100 retires
    # no pages (it remaps rows), its SXM boards have no fan, and no XID happened
    absent = {n for n, c in rows.items() if c[5] not in ("not served", "label")} - set(served)
    assert absent == {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE",
                      "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_FAN_SPEED",
                      "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_XID_ERRORS_TOTAL"}, absent


def _pcie(body: bytes, name: str = "DCGM_FI_PROF_PCIE_TX_BYTES") -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in compat_families(body)[name].samples}


def _counter(body: bytes, name: str = "gpu_pcie_transmit_bytes_total") -> dict[str, float]:
    family = families(body)[name.removesuffix("_total")]
    return {s.labels["gpu"]: s.value for s in family.samples if s.name == name}


def test_pcie_rates_without_gpm_come_from_the_sweeps_own_reads(running_exporter):
    """Profiling off: DCGM_FI_PROF_PCIE_*_BYTES is the PCIe counters' rate between the
    sweep's last two reads of them (--sweep.health-interval apart), whatever the scrapes."""
    exp = running_exporter.start(manual=True, metrics_compat="dcgm-exporter",
                                 collector_profiling=False)
    exp.sampler.advance(1)
    _, body = http_get(exp.port)
    assert "DCGM_FI_PROF_PCIE_TX_BYTES" not in compat_families(body)  # one read: no rate yet
    exp.sampler.advance(20)
    _, before = http_get(exp.port)
    interval = exp.sampler.settings.gpu_health_interval_seconds
    exp.sampler.advance(interval)  # one health interval: one more read of the counters
    for _ in range(3):  # scrapes in between change nothing: the rate is the sampler's
        _, after = http_get(exp.port)
    tx, rx = _pcie(after), _pcie(after, "DCGM_FI_PROF_PCIE_RX_BYTES")
    sent_before, sent_after = _counter(before), _counter(after)
    received_before = _counter(before, "gpu_pcie_receive_bytes_total")
    received_after = _counter(after, "gpu_pcie_receive_bytes_total")
    assert set(tx) == set(rx) == {str(g) for g in range(8)}
    for gpu in tx:
        assert math.isclose(tx[gpu], (sent_after[gpu] - sent_before[gpu]) / interval)
        assert math.isclose(rx[gpu], (received_after[gpu] - received_before[gpu]) / interval)
        assert tx[gpu] > 0 and rx[gpu] > 0
    assert compat_families(after)["DCGM_FI_PROF_PCIE_TX_BYTES"].type == "gauge"
    # profiling off leaves the PCIe rates served: the start's line does not list them
    assert "DCGM_FI_PROF_PCIE" not in dcgm.summary(profiling=False)


def test_pcie_rate_prefers_gpm_and_falls_back_to_the_sweep():
    from exporter.collectors.profiling.reading import GpuProfile, ProfilingReading
    from exporter.gpu import gpm

    interval = gpm.GpmReading(0.0, 10.0, {}, {"pcie_transmit_bytes_per_second": 7e9,
                                              "pcie_receive_bytes_per_second": 3e9})
    profiling = ProfilingReading(10.0, {0: GpuProfile(gpm.SUPPORTED, interval),
                                        1: GpuProfile(gpm.SUPPORTED, None)}, {})
    snap = make_snapshot(3, collectors={"profiling": CollectorResult(profiling, 0.0, True, 0)},
                         pcie_rates={0: (1.0, 2.0), 1: (4e8, None)})
    text = dcgm.DcgmCompat("n1").render(snap, unknown_health(snap.time, 3)).decode()
    tx = {line.split('gpu="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
          for line in text.splitlines() if line.startswith("DCGM_FI_PROF_PCIE_TX_BYTES{")}
    rx = {line.split('gpu="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
          for line in text.splitlines() if line.startswith("DCGM_FI_PROF_PCIE_RX_BYTES{")}
    assert tx == {"0": 7e9, "1": 4e8}  # GPM's where read; the sweep's until GPM's first
    assert rx == {"0": 3e9}  # a counter gone backwards gives none; GPU 2: no reads yet


def test_the_sweeps_pcie_rate_is_over_its_own_previous_read():
    from exporter.gpu.reading import GpuReading
    from exporter.sampling.sweep import SweepSampler

    sweep = SweepSampler(None, None, 1.0, 5.0, 30.0)  # type: ignore[arg-type]

    def read(t: float, sent: float | None, received: float | None) -> tuple | None:
        values = {k: v for k, v in (("pcie_transmit_bytes", sent),
                                    ("pcie_receive_bytes", received)) if v is not None}
        sweep._rate_pcie(0, GpuReading(t, values))
        return sweep.pcie_rates.get(0)

    assert read(100.0, 1000.0, 500.0) is None  # one read: no rate
    assert read(105.0, 6000.0, 1500.0) == (1000.0, 200.0)
    assert read(110.0, 100.0, 2500.0) == (None, 200.0)  # reset: no rate, not a negative one
    assert read(115.0, 600.0, None) == (100.0, None)  # a counter NVML did not give
    assert read(115.0, 700.0, 3000.0) == (100.0, None)  # no time passed: the last rate kept
