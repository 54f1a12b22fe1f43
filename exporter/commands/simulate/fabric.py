"""One virtual node's InfiniBand fabric: a generated /sys/class/infiniband tree whose
counters advance with the node's traffic and its scenario's InfiniBand faults, written
atomically so the real InfiniBand collector reads it as it would a host's."""

from __future__ import annotations

import os
from pathlib import Path

from exporter.commands.simulate.scenario import IbFault, InfinibandSpec

_IB_ZERO_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "port_rcv_constraint_errors", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_rcv_discards",
    "port_xmit_constraint_errors", "port_xmit_discards", "symbol_error",
    "multicast_rcv_packets", "multicast_xmit_packets")
_TRAFFIC_COUNTERS = ("port_rcv_data", "port_xmit_data", "port_rcv_packets", "port_xmit_packets",
                     "unicast_rcv_packets", "unicast_xmit_packets", "port_xmit_wait")
_HW_COUNTERS = ("rnr_nak_retry_err", "local_ack_timeout_err", "out_of_sequence",
                "packet_seq_err", "out_of_buffer")
_STATES = {True: ("4: ACTIVE", "5: LinkUp"), False: ("1: DOWN", "3: Disabled")}


class NodeFabric:
    """One node's /sys/class/infiniband tree; `update(t)` advances it to fleet time t."""

    def __init__(self, root: Path, node: int, spec: InfinibandSpec, faults: list[IbFault],
                 training: bool):
        self.root, self.spec, self.faults, self.training = root, spec, faults, training
        self.staging = root / "staging"
        self.staging.mkdir(parents=True, exist_ok=True)
        self.written: dict[Path, str] = {}
        self.atomic = False  # no reader yet: the first tree is written in place
        self.traffic_time = [0.0] * spec.hcas  # seconds of traffic while up, per HCA
        self.last_t = 0.0
        for hca in range(spec.hcas):
            dev = self.dev(hca)
            for sub in ("counters", "hw_counters"):
                (dev / "ports" / "1" / sub).mkdir(parents=True, exist_ok=True)
            self._write(dev / "fw_ver", "28.39.1002")
            self._write(dev / "board_id", "MT_0000000838")
            self._write(dev / "hca_type", "MT4129")
            self._write(dev / "node_guid", f"b83f:d203:{node:04x}:{hca:04x}")
            self._write(dev / "ports" / "1" / "link_layer", spec.link_layer)
            self._write(dev / "ports" / "1" / "hw_counters" / "lifespan", "10")
        self.update(0.0)
        self.atomic = True

    def dev(self, hca: int) -> Path:
        return self.root / "class" / "infiniband" / f"mlx5_{hca}"

    def _write(self, path: Path, value: object) -> None:
        text = f"{value}\n"
        if self.written.get(path) == text:
            return
        if not self.atomic:
            path.write_text(text)
        else:
            tmp = self.staging / path.name
            tmp.write_text(text)
            os.replace(tmp, path)  # atomic: a reader never sees a half-written file
        self.written[path] = text

    def update(self, t: float) -> None:
        dt = max(0.0, t - self.last_t)
        self.last_t = t
        for hca in range(self.spec.hcas):
            mine = [f for f in self.faults if f.hca == hca]
            down = any(f.kind == "ib_down" and f.active(t) for f in mine)
            if not down:
                self.traffic_time[hca] += dt
            rate = next((f.params["rate"] for f in mine if f.kind == "ib_rate" and f.active(t)),
                        self.spec.rate)
            port = self.dev(hca) / "ports" / "1"
            state, phys = _STATES[not down]
            self._write(port / "state", state)
            self._write(port / "phys_state", phys)
            self._write(port / "rate", "10 Gb/sec (4X SDR)" if down else rate)
            counters = dict.fromkeys(_IB_ZERO_COUNTERS, 0)
            hw = dict.fromkeys(_HW_COUNTERS, 0)
            counters["link_downed"] = 1 + sum(1 for f in mine if f.kind == "ib_down" and t >= f.at)
            for f in mine:
                if f.kind != "ib_errors":
                    continue
                seconds = f.active_seconds(t)
                for key, per_second in f.params.items():
                    name = key.removesuffix("_per_second")
                    target = hw if name in hw else counters
                    target[name] = target.get(name, 0) + int(per_second * seconds)
            busy = self.traffic_time[hca] if self.training else self.traffic_time[hca] * 1e-4
            words = int(busy * self.spec.bytes_per_second / 4)
            packets = words // 1024
            counters.update(port_rcv_data=words, port_xmit_data=words, port_rcv_packets=packets,
                            port_xmit_packets=packets, unicast_rcv_packets=packets,
                            unicast_xmit_packets=packets, port_xmit_wait=packets // 50)
            for key, value in counters.items():
                self._write(port / "counters" / key, value)
            for key, value in hw.items():
                self._write(port / "hw_counters" / key, value)
