"""Helpers for tests that need external binaries (promtool, node_exporter, ...)."""

from __future__ import annotations

import os
import shutil

import pytest


def require_binary(name: str) -> str:
    """Path of ``name``; skip without it, or fail when CI sets ``CTE_REQUIRE_TOOLS=1``."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CTE_REQUIRE_TOOLS") == "1":
        pytest.fail(f"{name} is required (install the Debian package)")
    pytest.skip(f"{name} not installed")
