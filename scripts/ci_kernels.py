#!/usr/bin/env python3
"""Which forced numerical kernels this CPU can run, for .ci/run's golden loop.

A forced kernel runs instructions the CPU may lack: OpenBLAS with OPENBLAS_CORETYPE=SkylakeX on
a CPU without AVX-512 dies with an illegal instruction. Each kernel names the /proc/cpuinfo flags
it needs (the instruction sets the kernel family is built for in OpenBLAS's Makefile.x86_64:
SkylakeX is -march=skylake-avx512, Haswell and Zen are -mavx2 with FMA). A kernel runs only where
the CPU shows all of them.

Output: one line per kernel that runs, `name<TAB>VARIABLE<TAB>value`, on stdout (for the loop);
one log line per kernel, ran or skipped and why, on stderr.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

AVX512 = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")


@dataclass(frozen=True)
class Kernel:
    name: str
    variable: str
    value: str
    needs: tuple[str, ...]
    why: str  # what the kernel is, for the log


# numpy's OpenBLAS picks its kernels by CPU, and they round differently in the last digits.
# numpy's own SIMD paths differ too: exp and log round otherwise with AVX-512 than without;
# turning them off means something only where numpy would use them (the names numpy 1.x and
# 2.x give them; numpy 2.x passes over a name it does not know).
KERNELS = (
    Kernel("openblas-skylakex", "OPENBLAS_CORETYPE", "SkylakeX", AVX512,
           "OpenBLAS's AVX-512 kernels"),
    Kernel("openblas-haswell", "OPENBLAS_CORETYPE", "Haswell", ("avx2", "fma"),
           "OpenBLAS's AVX2 kernels"),
    Kernel("openblas-zen", "OPENBLAS_CORETYPE", "Zen", ("avx2", "fma"),
           "OpenBLAS's kernels for AMD Zen"),
    Kernel("numpy-no-avx512", "NPY_DISABLE_CPU_FEATURES", "AVX512F AVX512_SKX AVX512_ICL X86_V4",
           ("avx512f",), "numpy with its AVX-512 paths off"),
)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo text (x86 names them `flags`)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def plan(cpuinfo: str) -> tuple[list[Kernel], list[tuple[Kernel, str]]]:
    """The kernels that run, and those skipped with the reason."""
    flags = cpu_flags(cpuinfo)
    runs: list[Kernel] = []
    skipped: list[tuple[Kernel, str]] = []
    for kernel in KERNELS:
        missing = [flag for flag in kernel.needs if flag not in flags]
        if not flags:
            skipped.append((kernel, "no x86 'flags' line in /proc/cpuinfo"))
        elif missing:
            skipped.append((kernel, "the CPU lacks " + " ".join(missing)))
        else:
            runs.append(kernel)
    return runs, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpuinfo", type=Path, default=Path("/proc/cpuinfo"))
    args = parser.parse_args(argv)
    runs, skipped = plan(args.cpuinfo.read_text())
    log = sys.stderr
    print("golden kernels: native runs in the suite above", file=log)
    for kernel in runs:
        print(f"golden kernels: run  {kernel.name} ({kernel.why}; {kernel.variable}="
              f"{kernel.value}; the CPU has {' '.join(kernel.needs)})", file=log)
        print(f"{kernel.name}\t{kernel.variable}\t{kernel.value}")
    for kernel, reason in skipped:
        print(f"golden kernels: skip {kernel.name} ({kernel.why}): {reason}", file=log)
    if "avx2" in cpu_flags(args.cpuinfo.read_text()) and not runs:
        print("golden kernels: an AVX2 CPU runs no forced kernel; the golden loop would test "
              "nothing but the native one", file=log)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
