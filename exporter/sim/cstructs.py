"""Helpers for the ctypes arguments pynvml passes to the fake's symbols."""

from __future__ import annotations

import ctypes


def target(arg):
    """The ctypes object behind a byref() argument (or the object itself)."""
    return getattr(arg, "_obj", arg)


def value_of(arg) -> int:
    """An int argument, passed plain or as a ctypes value (byref or not)."""
    return arg if isinstance(arg, int) else target(arg).value


def write_pointer(out, value: int) -> None:
    """Store a pointer-sized handle into a byref() target or a pointer field."""
    pointer = ctypes.c_void_p(value)
    ctypes.memmove(ctypes.addressof(target(out)), ctypes.addressof(pointer),
                   ctypes.sizeof(ctypes.c_void_p))
