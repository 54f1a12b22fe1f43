"""`run` loads what it runs and no more: the other commands, the offline analysis and (on
real NVML) the simulator stay unimported, and every command still parses its own flags."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.cli import _COMMANDS, main

_LOADED = ("import sys\n"
           "print(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules if m.startswith("
           "('exporter.commands', 'exporter.offline', 'exporter.sim', 'exporter.fleet'))}))")


def _modules_after(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code + "\n" + _LOADED],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_run_help_imports_no_other_command():
    code = ("import contextlib, io\nfrom exporter.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['run', '--help'])")
    assert _modules_after(code) == "[]"


def test_exporter_on_real_nvml_imports_no_simulator():
    """Where the driver is missing the start fails (NvmlUnavailable) after the backend was
    chosen: still, nothing of the simulator was loaded for it."""
    code = ("import exporter.cli, exporter.service\n"
            "from exporter.app import Exporter\nfrom exporter.config import Config\n"
            "e = Exporter(Config.of(listen_address='127.0.0.1:0'))\n"
            "try:\n    e.start(threads=False)\nexcept Exception:\n    pass\n"
            "finally:\n    e.stop()")
    assert _modules_after(code) == "[]"


@pytest.mark.parametrize("command", ["run", "check-config", *_COMMANDS])
def test_every_command_parses_its_own_flags(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: cluster-telemetry-exporter {command}")
    assert "options:" in out


def test_a_command_built_alone_still_lists_the_others(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("run", "check-config", *_COMMANDS))


def test_an_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bogus"])
    assert exit_.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
