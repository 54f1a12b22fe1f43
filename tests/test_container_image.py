"""The container image (deploy/container/Containerfile), built and run for real.

buildah builds the image on a base made from Debian packages (tests/image_base.py: no
registry is reachable, so not the default python:3.12-slim) and runs the exporter inside
it; the test scrapes it from outside. `buildah ... --isolation chroot` because this kind
of sandbox refuses the setrlimit calls of a full OCI runtime; the chroot shares the host's
network, so the exporter listens on loopback only.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from exporter import __version__
from tests import image_base
from tests.tools import REPO, free_port, require_binary, stop_process, wait_for

pytestmark = pytest.mark.image

CONTAINERFILE = REPO / "deploy" / "container" / "Containerfile"


def _cannot(why: str) -> None:
    """Skip, or fail where the tools are required (CI)."""
    if os.environ.get("CTE_REQUIRE_TOOLS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _need_root() -> None:
    if os.geteuid() != 0:
        _cannot("building the image needs root (buildah's storage)")


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[str, str]]:
    """(image name, container name) of a fresh build, removed afterwards."""
    _need_root()
    buildah = require_binary("buildah")
    debootstrap = require_binary("debootstrap")
    release = image_base.debian_release()
    if release is None:
        _cannot("the base image is made with debootstrap from the host's Debian release")
    base = image_base.base_image(buildah, debootstrap, release)
    wheels = image_base.wheelhouse()
    name = f"localhost/cte-test:{uuid.uuid4().hex[:12]}"
    build = subprocess.run(
        [buildah, "bud", "--isolation", "chroot", "-q", "-f", str(CONTAINERFILE),
         "--build-arg", f"BASE_IMAGE={base}",
         "--build-arg", "PIP_OPTIONS=--no-index --find-links /wheels",
         "--volume", f"{wheels}:/wheels:ro", "-t", name, str(REPO)],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-5000:]
    container = subprocess.run([buildah, "from", "-q", name], capture_output=True, text=True,
                               timeout=120).stdout.strip()
    try:
        yield name, container
    finally:
        subprocess.run([buildah, "rm", container], capture_output=True, timeout=120)
        subprocess.run([buildah, "rmi", name], capture_output=True, timeout=120)


def run_in(container: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["buildah", "run", "--isolation", "chroot", container, "--", *args],
                          capture_output=True, text=True, timeout=timeout)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except OSError:
        return 0, ""


def test_image_config_runs_the_exporter_as_nobody(image):
    name, container = image
    inspected = json.loads(subprocess.run(["buildah", "inspect", "--type", "image", name],
                                          capture_output=True, text=True, timeout=60).stdout)
    config = inspected["OCIv1"]["config"]
    assert config["User"] == "65534:65534"
    assert config["Entrypoint"] == ["cluster-telemetry-exporter"] and config["Cmd"] == ["run"]
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["Env"]
    assert "9955/tcp" in config["ExposedPorts"]
    assert run_in(container, "id", "-u").stdout.strip() == "65534"
    # NVML comes from the host (the NVIDIA container toolkit): none in the image
    probe = run_in(container, "python3", "-c",
                   "import ctypes.util; print(ctypes.util.find_library('nvidia-ml'))")
    assert probe.stdout.strip() == "None", probe.stderr
    # what the image adds to its base: the exporter's virtual environment (numpy and
    # grpcio are most of it); docs/kubernetes.md gives the figure
    venv = run_in(container, "du", "-sm", "/opt/cte")
    assert int(venv.stdout.split()[0]) < 200, venv.stdout
    # the kubernetes extra is in: gpu_pod_info can be read from the kubelet's socket
    grpc = run_in(container, "python3", "-c", "import grpc")
    assert grpc.returncode == 0, grpc.stderr


def test_without_a_driver_it_says_how_to_try_it(image):
    _, container = image
    result = run_in(container, "cluster-telemetry-exporter", "run")
    assert "NVML is not available" in result.stderr and "--fake" in result.stderr


def test_the_exporter_in_the_image_serves_metrics(image):
    _, container = image
    port = free_port()
    proc = subprocess.Popen(
        ["buildah", "run", "--isolation", "chroot", container, "--",
         "cluster-telemetry-exporter", "run", "--fake", "--web.listen-address",
         f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: get(f"{base}/healthz")[0] == 200 or proc.poll() is not None,
                 timeout=120, interval=0.5)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert get(f"{base}/healthz")[1].strip() == "ok"
        assert get(f"{base}/readyz")[1].strip() == "ok"
        status, metrics = get(f"{base}/metrics")
        assert status == 200
        assert f'version="{__version__}"' in metrics and "cte_build_info" in metrics
        gpus = {line.split('gpu="')[1].split('"')[0] for line in metrics.splitlines()
                if line.startswith("gpu_") and 'gpu="' in line}
        assert gpus == {str(i) for i in range(8)}  # the fake 8-GPU node
    finally:
        stop_process(proc)
