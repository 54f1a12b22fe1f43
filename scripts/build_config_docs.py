"""Write docs/configuration.md from the settings declarations (each area's settings
dataclass, exporter/options.py, and each collector's spec), so the flags table can never
drift from the code.

    .venv/bin/python scripts/build_config_docs.py        # rewrite the file
    .venv/bin/python scripts/build_config_docs.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.collectors import registry  # noqa: E402
from exporter.config import all_options  # noqa: E402
from exporter.options import HEALTH, RECORD, RUN, SIMULATE, Option  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

HEAD = """# Configuration

`cluster-telemetry-exporter run [--config FILE] [flags]`: flags win over the file.
`cluster-telemetry-exporter check-config FILE` validates a file; any mistake in a file
or flag stops the start with one line naming the file, line and key, and exit code 2.
An example file is `deploy/config.yaml`.

This page is generated from the settings declarations (each area's settings dataclass:
`Config` in `exporter/config.py` and the sections it is composed of, and each
collector's spec in `exporter/collectors/`) by `.venv/bin/python scripts/build_config_docs.py`;
a test keeps it current.
"""


def _default(option: Option) -> str:
    if option.kind is bool:
        if option.default is None:
            return "see meaning"
        return "on" if option.default else "off"
    if option.default in (None, ""):
        return "unset"
    text = f"{option.default:g}" if isinstance(option.default, float) else str(option.default)
    return f"`{text}`".replace("|", "\\|")


def _flag(option: Option) -> str:
    if option.flag is None:
        return "(file only)"
    return f"`--[no-]{option.flag[2:]}`" if option.kind is bool and option.key != "fake" else (
        f"`{option.flag}`")


def _range(option: Option) -> str:
    if option.low is not None:
        return f" ({option.low:g}-{option.high:g})"
    if option.choices:
        return f" ({', '.join(option.choices)})"
    return ""


def table(options: list[Option]) -> list[str]:
    lines = ["| Flag | Config key | Default | Commands | Meaning |", "|---|---|---|---|---|"]
    for option in options:
        commands = ", ".join(c for c in (RUN, SIMULATE, RECORD, HEALTH) if c in option.commands)
        lines.append(f"| {_flag(option)} | `{option.key}` | {_default(option)} | {commands} | "
                     f"{option.help}{_range(option)} |")
    return lines


def render() -> str:
    collector_keys = {o.key for o in registry.options()}
    core = [o for o in all_options() if o.key not in collector_keys]
    out = [HEAD, "## Exporter", "", *table(core), "", "## Collectors", "",
           "Each collector has an on/off flag and its own options; `check-config` lists the "
           "ones a file enables.", ""]
    for spec in registry.specs():
        out += [f"### {spec.name}", "", *table([spec.toggle, *spec.options]), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run .venv/bin/python scripts/build_config_docs.py")
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
