"""Other exporters' metric families served from our own snapshot (`--metrics.compat`)."""
