"""Parts of scripts/device_check.py: running the exporter, and printing the report."""
