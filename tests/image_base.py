"""A base image for the container test, made from Debian packages, and the wheels to
build on it offline; both cached between runs.

No image registry is reachable from CI, so the test cannot pull `python:3.12-slim`: it
makes its own base with `debootstrap --variant=minbase` (Debian's python3 and venv, the
host's release, so the host's wheels fit) and imports it into buildah's storage. That
takes about a minute; the root file system is kept as a tar file in the cache directory
(`CTE_TEST_CACHE`, else `$XDG_CACHE_HOME/cluster-telemetry-exporter`, else
`~/.cache/cluster-telemetry-exporter`) and the image in buildah's storage, both named by
a key of the release, packages and architecture, and reused while they exist.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from tests.tools import REPO

PACKAGES = ("python3", "python3-venv")
MIRROR = os.environ.get("CTE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
LAYOUT = "1"  # bump when the way the base is made changes


def cache_dir() -> Path:
    root = os.environ.get("CTE_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "cluster-telemetry-exporter")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def debian_release() -> str | None:
    """The host's Debian release (its codename), or None on another system."""
    try:
        fields = dict(line.split("=", 1) for line in
                      Path("/etc/os-release").read_text().splitlines() if "=" in line)
    except OSError:
        return None
    if fields.get("ID", "").strip('"') != "debian":
        return None
    return fields.get("VERSION_CODENAME", "").strip('"') or None


@contextmanager
def locked(name: str):
    """One test run at a time makes a cached thing (parallel runs on one machine)."""
    with open(cache_dir() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(args: list[str], timeout: float) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} ...: exit {result.returncode}\n"
                           f"{result.stdout[-2000:]}{result.stderr[-4000:]}")
    return result.stdout


def image_exists(buildah: str, name: str) -> bool:
    return subprocess.run([buildah, "inspect", "--type", "image", name],
                          capture_output=True, timeout=60).returncode == 0


def base_image(buildah: str, debootstrap: str, release: str) -> str:
    """The name of the base image in buildah's storage, made if it is not there."""
    key = hashlib.sha256(" ".join((LAYOUT, release, platform.machine(), MIRROR, *PACKAGES))
                         .encode()).hexdigest()[:12]
    name = f"localhost/cte-test-base:{key}"
    with locked("image-base"):
        if image_exists(buildah, name):
            return name
        tarball = cache_dir() / f"image-base-{key}.tar"
        if not tarball.exists():
            with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
                rootfs = Path(tmp) / "rootfs"
                _run([debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}",
                      release, str(rootfs), MIRROR], timeout=900)
                _run(["tar", "-C", str(rootfs), "-cf", f"{tarball}.part", "."], timeout=300)
                os.replace(f"{tarball}.part", tarball)
        container = _run([buildah, "from", "scratch"], timeout=60).strip()
        try:
            _run([buildah, "add", container, str(tarball), "/"], timeout=300)
            _run([buildah, "commit", "-q", container, name], timeout=300)
        finally:
            subprocess.run([buildah, "rm", container], capture_output=True, timeout=60)
    return name


def wheelhouse() -> Path:
    """Wheels of every dependency (and of the build backend) for an offline image build,
    made with this Python's pip (same version as the base's Debian python3)."""
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:12]
    path = cache_dir() / f"wheels-{key}"
    with locked("wheels"):
        if not (path / "complete").exists():
            path.mkdir(exist_ok=True)
            _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                  "-w", str(path), f"{REPO}[kubernetes]", "setuptools>=77"], timeout=900)
            for own in path.glob("cluster_telemetry_exporter-*.whl"):
                own.unlink()  # the image builds the exporter from the source
            (path / "complete").touch()
    return path
