"""cluster-telemetry-exporter: per-node GPU telemetry for training clusters."""

__version__ = "0.1.0"
