"""The Python package: built as the README says (wheel and sdist), clean under
`twine check`, installed into a fresh virtual environment, and with one version.

The README's install lines are the ones run here, on a copy of the repository (so the
checkout gets no dist/ or build/): the block under "Running on a GPU node", its first two
lines, with /opt/cte moved into the test's directory.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from exporter import __version__
from tests.tools import REPO

IGNORED = (".venv", ".git", "dist", "build", "*.egg-info", "__pycache__", ".pytest_cache",
           ".ruff_cache", ".whl", ".gl")


def readme_install_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Running on a GPU node\n.*?```sh\n(.*?)\n```", text, re.S)
    assert block, "README.md: no sh block under 'Running on a GPU node'"
    lines = block.group(1).splitlines()
    assert len(lines) == 3 and "python -m build" in lines[0] and "pip install dist/" in lines[1]
    return lines


def test_readme_install_lines_build_a_wheel_that_installs_and_runs(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*IGNORED))
    opt = tmp_path / "opt-cte"
    build, install, run = readme_install_lines()
    script = "set -e\n" + "\n".join((build, install.replace("/opt/cte", str(opt))))
    result = subprocess.run(["bash", "-c", script], cwd=source, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    dist = sorted(p.name for p in (source / "dist").iterdir())
    assert dist == [f"cluster_telemetry_exporter-{__version__}-py3-none-any.whl",
                    f"cluster_telemetry_exporter-{__version__}.tar.gz"]
    twine = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                            *(str(source / "dist" / name) for name in dist)],
                           capture_output=True, text=True, timeout=120)
    assert twine.returncode == 0, twine.stdout + twine.stderr

    # the installed command is the one the README's third line runs
    command = run.split()[0].replace("/opt/cte", str(opt))
    version = subprocess.run([command, "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.stdout.strip() == f"cluster-telemetry-exporter {__version__}", version
    # package data made it into the wheel: a scenario and a fleet scenario (read by the
    # commands' subpackage) load, the live page's files exist
    check = subprocess.run([str(opt / "bin" / "python"), "-c",
                            "from exporter.sim.scenarios import load_scenario;"
                            "from exporter.commands.simulate.scenario import "
                            "load_fleet_scenario;"
                            "import exporter.web, pathlib;"
                            "load_scenario('mig'); load_fleet_scenario('two-jobs');"
                            "print(len(list((pathlib.Path(exporter.web.__file__).parent"
                            " / 'static').iterdir())))"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert check.returncode == 0 and int(check.stdout) > 0, check.stderr


def test_metadata_is_complete_and_the_version_has_one_home():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    for key in ("description", "readme", "requires-python", "authors", "classifiers"):
        assert project[key], key
    chart = yaml.safe_load((REPO / "deploy/helm/cluster-telemetry-exporter/Chart.yaml")
                           .read_text())
    assert chart["appVersion"] == __version__


def test_readme_promises_no_registry_name():
    """Until a release is published, nothing tells users to install a name from an index
    (anyone could register it)."""
    text = (REPO / "README.md").read_text() + "".join(
        p.read_text() for p in (REPO / "docs").glob("*.md"))
    assert not re.search(r"pip install ['\"]?cluster-telemetry-exporter", text)
    assert not re.search(r"pipx install ['\"]?cluster-telemetry-exporter", text)
    assert Path(REPO / "deploy" / "container" / "Containerfile").exists()
