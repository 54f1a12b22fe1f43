"""cluster-telemetry-exporter: per-node GPU telemetry for training clusters."""

__version__ = "0.1.0"

from exporter import lazy  # noqa: E402  (before any module of ours imports it)

lazy.install()
