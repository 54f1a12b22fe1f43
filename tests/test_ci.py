"""The README's test command: the same in .ci/run, and it works as root and as a user.

A fresh root container has no sudo, so a command that starts with `sudo` exits 127
before anything is installed. The install step runs here against
stand-ins for apt-get, id and sudo on a PATH of their own: nothing is installed.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.tools import REPO

PACKAGES = ("prometheus prometheus-node-exporter victoria-metrics prometheus-alertmanager openssl "
            "systemd chromium buildah debootstrap slurmctld slurmd munge python3-venv")


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



# The golden loop's forced kernels (scripts/ci_kernels.py), fed /proc/cpuinfo text.
BASE = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
        "sse sse2 ht syscall nx lm constant_tsc pni pclmulqdq ssse3 cx16 sse4_1 sse4_2 popcnt "
        "aes xsave")
EPYC_ZEN3 = BASE + " fma avx f16c avx2 bmi1 bmi2 adx sha_ni vaes vpclmulqdq"  # no AVX-512
SAPPHIRE_RAPIDS = EPYC_ZEN3 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16"
KNIGHTS_LANDING = BASE + " fma avx avx2 avx512f avx512pf avx512er avx512cd"  # no bw, dq, vl
SANDY_BRIDGE = BASE + " avx"


def cpuinfo(flags: str, processors: int = 2) -> str:
    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\nmodel name\t: test CPU\nflags\t\t: {f}\n"
    return "\n".join(block.format(n=n, f=flags) for n in range(processors))


def ci_kernels():
    spec = importlib.util.spec_from_file_location("ci_kernels", REPO / "scripts" / "ci_kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def planned(flags: str) -> tuple[list[str], dict[str, str]]:
    runs, skipped = ci_kernels().plan(cpuinfo(flags))
    return [k.value for k in runs], {k.value: reason for k, reason in skipped}


def test_an_avx2_cpu_without_avx512_runs_haswell_and_zen_and_skips_the_avx512_kernels():
    runs, skipped = planned(EPYC_ZEN3)
    assert runs == ["Haswell", "Zen"]
    assert skipped == {
        "SkylakeX": "the CPU lacks avx512f avx512cd avx512bw avx512dq avx512vl",
        "AVX512F AVX512_SKX AVX512_ICL X86_V4": "the CPU lacks avx512f"}


def test_an_avx512_cpu_runs_every_kernel():
    runs, skipped = planned(SAPPHIRE_RAPIDS)
    assert runs == ["SkylakeX", "Haswell", "Zen", "AVX512F AVX512_SKX AVX512_ICL X86_V4"]
    assert skipped == {}


def test_skylakex_needs_the_whole_avx512_set_not_only_avx512f():
    runs, skipped = planned(KNIGHTS_LANDING)
    assert "SkylakeX" not in runs
    assert skipped["SkylakeX"] == "the CPU lacks avx512bw avx512dq avx512vl"
    # numpy would take its AVX512F paths there, so turning them off still means something
    assert "AVX512F AVX512_SKX AVX512_ICL X86_V4" in runs


def test_a_cpu_without_avx2_or_without_flags_runs_no_forced_kernel():
    runs, skipped = planned(SANDY_BRIDGE)
    assert runs == [] and skipped["Haswell"] == "the CPU lacks avx2 fma"
    runs, skipped = ci_kernels().plan("processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n")
    runs = [k.value for k in runs]
    skipped = {k.value: reason for k, reason in skipped}
    assert runs == [] and set(skipped.values()) == {"no x86 'flags' line in /proc/cpuinfo"}


def run_ci_kernels(tmp_path: Path, flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo(flags))
    return subprocess.run([sys.executable, str(REPO / "scripts" / "ci_kernels.py"), "--cpuinfo",
                           str(path)], capture_output=True, text=True, timeout=60)


def test_the_loop_reads_one_tab_separated_kernel_a_line_and_the_log_says_why(tmp_path):
    result = run_ci_kernels(tmp_path, EPYC_ZEN3)
    assert result.returncode == 0, result.stderr
    assert [line.split("\t") for line in result.stdout.splitlines()] == [
        ["openblas-haswell", "OPENBLAS_CORETYPE", "Haswell"],
        ["openblas-zen", "OPENBLAS_CORETYPE", "Zen"]]
    log = result.stderr.splitlines()
    assert "golden kernels: run  openblas-haswell (OpenBLAS's AVX2 kernels; " \
           "OPENBLAS_CORETYPE=Haswell; the CPU has avx2 fma)" in log
    assert "golden kernels: skip openblas-skylakex (OpenBLAS's AVX-512 kernels): the CPU lacks " \
           "avx512f avx512cd avx512bw avx512dq avx512vl" in log
    assert "golden kernels: skip numpy-no-avx512 (numpy with its AVX-512 paths off): the CPU " \
           "lacks avx512f" in log


def test_an_avx2_cpu_that_would_run_no_forced_kernel_fails(tmp_path):
    result = run_ci_kernels(tmp_path, BASE + " avx avx2")  # AVX2 without FMA
    assert result.returncode == 1 and result.stdout == ""
    assert "an AVX2 CPU runs no forced kernel" in result.stderr
    assert run_ci_kernels(tmp_path, SANDY_BRIDGE).returncode == 0


def test_ci_forces_only_the_kernels_the_script_allows():
    text = (REPO / ".ci" / "run").read_text()
    assert "kernels=$(.venv/bin/python scripts/ci_kernels.py)" in text
    assert "OPENBLAS_CORETYPE=" not in text and "NPY_DISABLE_CPU_FEATURES=" not in text
