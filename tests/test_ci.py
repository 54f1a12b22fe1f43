"""The README's test command: the same in .ci/run, and it works as root and as a user.

A fresh root container has no sudo, so a command that starts with `sudo` exits 127
before anything is installed. The install step runs here against
stand-ins for apt-get, id and sudo on a PATH of their own: nothing is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from tests.tools import REPO

PACKAGES = ("prometheus prometheus-node-exporter victoria-metrics prometheus-alertmanager openssl "
            "systemd chromium buildah debootstrap python3-venv")


def readme_test_command() -> str:
    text = (REPO / "README.md").read_text()
    block = re.search(r"\*\*Test it\*\*.*?```sh\n(.*?)\n```", text, re.S)
    assert block, "README.md: no **Test it** sh block"
    (line,) = block.group(1).splitlines()
    return line


def test_ci_runs_the_readme_test_command_verbatim():
    command = readme_test_command()
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in lines
    assert "pytest" in command and "ruff check" in command


def fake_bin(tmp_path: Path, uid: int, sudo: bool) -> Path:
    """A PATH with bash and env, a fake id, a recording apt-get and maybe a sudo."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    scripts = {
        "id": f'#!/bin/bash\n[ "$1" = -u ] && echo {uid}\n',
        "apt-get": '#!/bin/bash\necho "apt-get $*" >> "$LOG"\n',
    }
    if sudo:
        scripts["sudo"] = '#!/bin/bash\necho -n "sudo " >> "$LOG"\nexec "$@"\n'
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def install_step(tmp_path: Path, uid: int, sudo: bool) -> tuple[subprocess.CompletedProcess,
                                                                  list[str]]:
    step = readme_test_command().split(" && ")[0]
    log = tmp_path / "calls.log"
    env = {"PATH": str(fake_bin(tmp_path, uid, sudo)), "LOG": str(log)}
    result = subprocess.run(["/bin/bash", "-c", step], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    return result, log.read_text().splitlines() if log.exists() else []


def test_the_install_step_works_as_root_without_sudo(tmp_path):
    result, calls = install_step(tmp_path, uid=0, sudo=False)
    assert result.returncode == 0, result.stderr
    assert calls == ["apt-get update -qq",
                     f"apt-get install -y -qq --no-install-recommends {PACKAGES}"]


def test_the_install_step_uses_sudo_as_a_user(tmp_path):
    result, calls = install_step(tmp_path, uid=1000, sudo=True)
    assert result.returncode == 0, result.stderr
    assert calls == ["sudo apt-get update -qq",
                     f"sudo apt-get install -y -qq --no-install-recommends {PACKAGES}"]


def test_a_user_without_sudo_gets_one_clear_line(tmp_path):
    result, calls = install_step(tmp_path, uid=1000, sudo=False)
    assert result.returncode == 1 and calls == []
    assert result.stderr.strip() == f"install-deps: need root or sudo to install: {PACKAGES}"

