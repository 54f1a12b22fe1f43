"""The serving side's settings, each declared once (flag, config key, default, help)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.options import (
    DEFAULT_PORT,
    HEALTH,
    RUN,
    listen_address_problem,
    parse_listen_address,
    setting,
)


@dataclass(frozen=True)
class ServingSettings:
    listen_address: str = setting(
        f":{DEFAULT_PORT}", "address to serve on (host:port, [v6]:port)",
        flag="--web.listen-address", metavar="ADDR", check=listen_address_problem,
        commands=(RUN, HEALTH))
    web_config_file: str = setting(
        "", "TLS and basic auth, in the Prometheus exporter-toolkit web config format "
        "(unset: plain HTTP, no auth)", flag="--web.config.file", metavar="FILE",
        commands=(RUN, HEALTH))
    web_allow_security_downgrade: bool = setting(
        False, "let a reload apply a web config that takes away TLS, basic auth, client "
        "certificates or the client SAN allow-list the server has (else it is refused and "
        "the running one kept); starting on any valid web config is always allowed",
        flag="--web.allow-security-downgrade")
    stale_after_seconds: float = setting(
        10.0, "/healthz and /readyz are 503 once the last snapshot is older than this; "
        "/readyz lists loops stale this long", flag="--health.stale-after", low=1.0,
        high=3600.0, metavar="SECONDS")

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen_address(self.listen_address)
