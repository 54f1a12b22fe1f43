"""Run a unit's ExecStart under the unit's own hardening, as far as it applies without systemd.

bench/scale_stack.py (and so tests/test_e2e_scale.py) starts the services of deploy/scale this
way: a hardening option that would stop a service from working (a path it must write made
read-only, a device it opens hidden) fails the end-to-end test. Applied here, from the unit's
own settings, in a mount namespace of the process (util-linux's unshare and setpriv):

- ProtectSystem=strict: every mount read-only, but for the unit's StateDirectory= (the
  caller says where its data directory is);
- ProtectHome=yes: /home, /root and /run/user empty;
- PrivateDevices=yes: a /dev with only null, zero, full, random, urandom and tty;
- ProtectKernelTunables=yes, ProtectControlGroups=yes: /proc/sys, /sys and the cgroup tree
  read-only (they are with the rest);
- NoNewPrivileges=yes, CapabilityBoundingSet= and AmbientCapabilities= (empty), UMask=.

The rest only systemd applies; SYSTEMD_ONLY says why for each, and a unit option that is
in neither list stops the start, so a new option is never taken as applied.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The options run_sandboxed applies, and those it cannot (with why).
APPLIED = frozenset({
    "ProtectSystem", "ProtectHome", "PrivateDevices", "ProtectKernelTunables",
    "ProtectControlGroups", "NoNewPrivileges", "CapabilityBoundingSet", "AmbientCapabilities",
    "UMask", "StateDirectory", "PrivateMounts"})
SECCOMP = "a seccomp filter, which only systemd installs (no command-line tool does)"
SYSTEMD_ONLY = {
    "DynamicUser": "the test's files sit in a directory only the user running it may read",
    "PrivateUsers": "it maps the transient user, which the test does not run as",
    "PrivateTmp": "the test's files sit under /tmp",
    "DevicePolicy": "a cgroup device filter; PrivateDevices= already hides the devices",
    "ProtectKernelModules": "it drops a capability the process never had",
    "ProtectKernelLogs": "it drops a capability the process never had",
    "ProtectClock": "it drops a capability the process never had",
    "ProtectHostname": "a UTS namespace: nothing to see in a test",
    "ProtectProc": "a /proc mount option of systemd's own mount of /proc",
    "RemoveIPC": "it acts when the transient user's last process ends",
    "RestrictNamespaces": SECCOMP, "RestrictSUIDSGID": SECCOMP, "LockPersonality": SECCOMP,
    "RestrictRealtime": SECCOMP, "MemoryDenyWriteExecute": SECCOMP,
    "SystemCallArchitectures": SECCOMP, "SystemCallFilter": SECCOMP,
    "SystemCallErrorNumber": SECCOMP, "RestrictAddressFamilies": SECCOMP,
    "LimitNOFILE": "raising a hard limit needs a privilege the test may not have",
}
# Settings that are not hardening: how the service starts and restarts.
NOT_HARDENING = frozenset({"EnvironmentFile", "ExecStart", "Restart", "Type"})
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def service_settings(unit: Path) -> dict[str, list[str]]:
    """The [Service] section's KEY=VALUE settings (continued lines joined)."""
    settings: dict[str, list[str]] = {}
    section, lines = "", iter(unit.read_text().splitlines())
    for line in lines:
        if line.startswith("["):
            section = line.strip()
            continue
        if section != "[Service]" or not line.strip() or line.startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines).strip()
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def unknown_options(unit: Path) -> list[str]:
    """Options of the unit this module neither applies nor knows it cannot."""
    return sorted(set(service_settings(unit)) - APPLIED - set(SYSTEMD_ONLY) - NOT_HARDENING)


def sandboxed(unit: Path, argv: list[str], state_dir: Path | None) -> list[str]:
    """argv wrapped in the unit's hardening; state_dir is where its StateDirectory= is."""
    unknown = unknown_options(unit)
    if unknown:
        raise ValueError(f"{unit.name}: hardening option(s) the test cannot place: {unknown}")
    settings = service_settings(unit)
    one = {key: values[-1] for key, values in settings.items()}
    inner = [sys.executable, str(Path(__file__).resolve())]
    if one.get("ProtectSystem") == "strict":
        inner.append("--read-only")
    if "StateDirectory" in one:
        if state_dir is None:
            raise ValueError(f"{unit.name}: StateDirectory= needs the data directory")
        state_dir.mkdir(parents=True, exist_ok=True)
        inner += ["--writable", str(state_dir)]
    if one.get("ProtectHome") == "yes":
        inner.append("--protect-home")
    if one.get("PrivateDevices") == "yes":
        inner.append("--private-devices")
    if "UMask" in one:
        inner += ["--umask", one["UMask"]]
    privileges = [shutil.which("setpriv") or "setpriv"]
    if one.get("NoNewPrivileges") == "yes":
        privileges.append("--no-new-privs")
    if one.get("CapabilityBoundingSet") == "":
        privileges += ["--bounding-set=-all", "--inh-caps=-all"]
    if one.get("AmbientCapabilities") == "":
        privileges.append("--ambient-caps=-all")
    # A mount namespace of its own; a user who is not root gets one inside a user namespace.
    unshare = [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    return [*unshare, "--", *inner, "--", *privileges, "--", *argv]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        # mountinfo escapes space, tab, newline and backslash as octal
        points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point))
    return sorted(set(points), key=lambda p: (p.count("/"), p))


def _private_devices(stage: Path) -> None:
    _mount("--rbind", "/dev", str(stage))
    _mount("-t", "tmpfs", "-o", "mode=0755,nosuid", "tmpfs", "/dev")
    for name in DEVICES:
        (Path("/dev") / name).touch()
        _mount("--bind", str(stage / name), f"/dev/{name}")
    subprocess.run(["umount", "-l", str(stage)], check=True)
    stage.rmdir()


def main(argv: list[str]) -> None:
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    writable = [options[i + 1] for i, o in enumerate(options) if o == "--writable"]
    if "--private-devices" in options:
        _private_devices(Path(tempfile.mkdtemp(prefix="sandbox-dev-")))
    if "--protect-home" in options:
        for home in ("/home", "/root", "/run/user"):
            if Path(home).is_dir():
                _mount("-t", "tmpfs", "-o", "ro,mode=0000", "tmpfs", home)
    for path in writable:
        _mount("--bind", path, path)
    if "--read-only" in options:
        # a mount under /dev or a home now hidden by a tmpfs has no path left to remount
        for point in _mount_points():
            if point not in writable and os.path.lexists(point):
                _mount("-o", "remount,bind,ro", point)
    if "--umask" in options:
        os.umask(int(options[options.index("--umask") + 1], 8))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
