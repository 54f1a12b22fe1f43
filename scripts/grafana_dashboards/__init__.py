"""The five Grafana dashboards, one module each, built with grafana-foundation-sdk.

`common` holds what they share (variables, selectors, panel helpers, assembly); each
dashboard module lists its panels row by row and has `FILE` and `board()`.
`scripts/build_dashboards.py` writes them to dashboards/*.json.
"""

from . import cluster_overview, fabric, hardware_health, node_gpu_detail, power_swings

BOARDS = (cluster_overview, node_gpu_detail, power_swings, hardware_health, fabric)
