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


class HandleAddresses:
    """The pointer behind each handle object a caller passes, cached by the object.

    pynvml passes the same handle objects on every call, and reading one through
    ctypes.cast costs ~2 us, more than a simple getter's whole model. An entry holds its
    object, so its id() cannot be taken by another while it is cached, and its type, so
    a handle of another pynvml copy is checked afresh. What could change a cached object
    in place: a pointer written into it (the fake forgets the object when it writes one,
    see forget()), or a write to a buffer it is a view of (a struct member: never cached).
    """

    LIMIT = 1024  # entries; past it the cache starts again (handles made per call)

    def __init__(self):
        # id(handle) -> (handle, its type, its pointer); read directly by the fake's
        # hottest lookup (FakeNvmlLibrary.gpu)
        self.entries: dict[int, tuple[object, type, int]] = {}

    def address(self, handle: object, kind: type[ctypes._Pointer]) -> int | None:
        """The handle's pointer value; None if it is not a `kind`."""
        entry = self.entries.get(id(handle))
        if entry is not None and entry[0] is handle and entry[1] is kind:
            return entry[2]
        if not isinstance(handle, kind):
            return None
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        if handle._b_base_ is None:  # owns its memory: only a write into it changes it
            if len(self.entries) >= self.LIMIT:
                self.entries.clear()
            self.entries[id(handle)] = (handle, kind, address)
        return address

    def forget(self, obj) -> None:
        self.entries.pop(id(obj), None)

    def write(self, out, value: int) -> None:
        """write_pointer, forgetting what was cached for the object written."""
        write_pointer(out, value)
        self.forget(target(out))
