"""The history's pure parts: episode merging, the kernel log's records and XID lines."""

from __future__ import annotations

import pytest

from exporter.history.episodes import Merger
from exporter.sampling import kmsg

GPU = ("1652221000001", "GPU-a")


def test_a_gap_over_180_s_starts_a_new_episode():
    m = Merger()
    assert m.add(GPU, "xid", 0.0, 13)[1]
    assert not m.add(GPU, "xid", 180.0, 13)[1]  # 180 s after the last: same burst
    assert not m.add(GPU, "xid", 300.0, 13)[1]
    episode, new = m.add(GPU, "xid", 481.0, 13)  # 181 s after the last
    assert new and episode.count == 1
    assert m.open[(GPU, "xid", 13, "")].start == 481.0


@pytest.mark.parametrize("code", [74, 79, 95, 109, 119])
def test_sticky_xids_within_3_h_stay_one_episode(code):
    m = Merger()
    first, _ = m.add(GPU, "xid", 0.0, code)
    assert not m.add(GPU, "xid", 3600.0, code)[1]
    assert not m.add(GPU, "xid", 3600.0 + 10_800, code)[1]
    assert first.count == 3 and first.end == 14_400.0
    assert m.add(GPU, "xid", 14_400.0 + 10_801, code)[1]


def test_a_non_sticky_xid_an_hour_later_is_a_new_episode():
    m = Merger()
    m.add(GPU, "xid", 0.0, 13)
    assert m.add(GPU, "xid", 3600.0, 13)[1]


def test_kinds_gpus_and_codes_are_separate_episodes():
    m = Merger()
    m.add(GPU, "xid", 0.0, 13)
    assert m.add(GPU, "xid", 1.0, 31)[1]
    assert m.add(("", "GPU-b"), "xid", 1.0, 13)[1]
    assert m.add(GPU, "ecc_dbe", 1.0)[1]


# -- the kernel log ----------------------------------------------------------------------

# Line shapes from NVIDIA's "XID Errors" guide and drivers in the field: with pid and
# name, the newer pid='<unknown>', the older form without "PCI:", and 154's action text.
REAL = [
    ("NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception on "
     "(GPC 0, TPC 0, SM 0): Out Of Range Address", "0000:3b:00", 13),
    ("NVRM: Xid (PCI:0000:ba:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s of "
     "waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) "
     "(0x20802a02 0x8).", "0000:ba:00", 119),
    ("NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus.", "0000:01:00", 79),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", 14),
    ("NVRM: Xid (PCI:0000:41:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row "
     "(0x000000000001c9a0) marked for remapping, reset gpu to activate.", "0000:41:00", 63),
    ("NVRM: Xid (PCI:0000:ba:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
     "(GPU Reset Required)", "0000:ba:00", 154),
    ("NVRM: Xid (PCI:0000:B3:00): 48, pid=2418, name=python3, An uncorrectable double bit "
     "error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.",
     "0000:b3:00", 48),
]

LOOK_ALIKES = [
    # NVSwitch's SXids, the driver's other lines, another module's
    "nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 46 MINION Link not ready",
    "NVRM: GPU at PCI:0000:3b:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
    "NVRM: GPU Board Serial Number: 1652221000001",
    "mlx5_core 0000:17:00.0: NVRM: Xid (PCI:0000:17:00): 79, pid=1, not the driver",
    "NVRM: Xid (PCI:0000:3b:00) 13 without the colon",
    "NVRM: Xid (PCI:zzzz:3b:00): 13, pid=1, not hex",
    "nouveau 0000:01:00.0: fifo: PBDMA0: 01000000 [] ch 2 [00ff91f000 Xorg[1113]]",
]


@pytest.mark.parametrize("message,pci,code", REAL)
def test_real_xid_lines(message, pci, code):
    record = kmsg.parse_record(f"3,{1000},{5_000_000},-;{message}")
    xid = kmsg.parse_xid(record, boot_time=100.0)
    assert (xid.pci, xid.code, xid.sequence, xid.time) == (pci, code, 1000, 105.0)


@pytest.mark.parametrize("message", LOOK_ALIKES)
def test_look_alike_lines_are_not_xids(message):
    assert kmsg.parse_xid(kmsg.parse_record(f"4,7,1,-;{message}"), 0.0) is None


def test_a_user_space_line_that_says_the_same_is_not_an_xid():
    # facility 1 (user): priority 14 = 1 * 8 + 6; anyone may write this to /dev/kmsg
    line = "14,9,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, fake"
    assert kmsg.parse_xid(kmsg.parse_record(line), 0.0) is None


@pytest.mark.parametrize("text", ["", "garbage", "3,x,1,-;m", "3,1;m", "-1,2,3,-;m",
                                  "3,1,2;no flags"])
def test_malformed_records_are_skipped(text):
    assert kmsg.parse_record(text) is None


def test_pci_slot_reads_both_spellings():
    assert kmsg.pci_slot("00000000:3B:00.0") == kmsg.pci_slot("PCI:0000:3b:00") == "0000:3b:00"


def test_a_file_is_read_line_by_line_from_where_it_stopped(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,1,10,-;first\n SUBSYSTEM=pci\n6,2,20,-;sec")
    reader = kmsg.KmsgReader(str(log))
    assert [r.sequence for r in reader.read()] == [1]
    with open(log, "a") as f:
        f.write("ond\n6,3,30,-;third\n")
    got = reader.read()
    assert [(r.sequence, r.message) for r in got] == [(2, "second"), (3, "third")]
    assert reader.read() == []


def test_the_device_reads_without_blocking():
    reader = kmsg.KmsgReader()
    try:
        records = reader.read()
    except OSError:
        pytest.skip("no readable /dev/kmsg here")
    finally:
        reader.close()
    assert all(r.sequence >= 0 for r in records)


def test_boot_id_missing_is_empty(tmp_path):
    assert kmsg.read_boot_id(str(tmp_path / "none")) == ""
    (tmp_path / "id").write_text("3b6c1a2e-0000-4000-8000-000000000001\n")
    assert kmsg.read_boot_id(str(tmp_path / "id")) == "3b6c1a2e-0000-4000-8000-000000000001"


def test_docs_list_every_kind():
    from exporter.events import KINDS
    from tests.tools import REPO

    text = (REPO / "docs" / "history.md").read_text()
    assert [k for k in KINDS if f"| `{k}` |" not in text] == []


@pytest.mark.parametrize("path,backend,env,want", [
    ("auto", "nvml", {}, "/var/lib/cluster-telemetry-exporter"),
    ("auto", "nvml", {"STATE_DIRECTORY": "/var/lib/cte:/other"}, "/var/lib/cte"),
    ("auto", "fake", {"STATE_DIRECTORY": "/var/lib/cte"}, ""),
    ("auto", "replay", {}, ""),
    ("/srv/state", "fake", {}, "/srv/state"),
    ("", "nvml", {}, ""),
])
def test_the_state_directory_by_deployment(monkeypatch, path, backend, env, want):
    from exporter.config import Config

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert Config.of(storage_path=path).history.directory(backend) == want


def test_storage_path_is_a_flag_and_a_config_key(tmp_path):
    from exporter.config import build_config, load_config_file

    config = tmp_path / "c.yaml"
    config.write_text("storage_path: /srv/cte\n")
    assert load_config_file(config).history.storage_path == "/srv/cte"
    assert build_config(str(config), {"storage_path": "/x"}).history.storage_path == "/x"
