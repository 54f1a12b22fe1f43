"""Config validation and the command line: one clear line and exit 2 for every mistake."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exporter.config import Config, build_config, load_config_file, parse_listen_address
from exporter.sim.scenarios import load_scenario
from exporter.web.webconfig import load_web_config
from exporter.yamlfile import MAX_FILE_BYTES, MAX_MESSAGE_CHARS, ConfigError

CLI = [sys.executable, "-m", "exporter"]


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def write(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults():
    config = Config.of()
    assert config.host_port == ("", 9955)
    assert config.sampler.power_sample_rate_hz == 20
    assert config.sampler.sweep_interval_seconds == 1


def test_file_values_and_flags_win(tmp_path):
    path = write(tmp_path, "power_sample_rate_hz: 50\nlisten_address: '127.0.0.1:9999'\n")
    config = build_config(str(path), {"power_sample_rate_hz": 10.0, "fake": None})
    assert config.sampler.power_sample_rate_hz == 10.0  # the flag wins
    assert config.serving.listen_address == "127.0.0.1:9999"  # the file's value stays
    with pytest.raises(AttributeError):
        config.backend.fake = True  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(("text", "expected"), [
    ("power_sample_rate_hz: 500\n", r"config.yaml:1: power_sample_rate_hz: 500 is out of range"),
    ("\n\nbogus: 1\n", r"config.yaml:3: bogus: unknown key \(known keys: collector_host, "),
    # the likely key, not a list cut short before it
    ("web_listen_adress: ':9955'\n", r"web_listen_adress: unknown key \(did you mean "
     r"listen_address\?\)$"),
    ("Log_Level: info\n", r"Log_Level: unknown key \(did you mean log_level\?\)$"),
    ("sweep_interval: 2\n", r"sweep_interval: unknown key \(did you mean "
     r"sweep_interval_seconds\?\)$"),
    # a command-line flag written as a key: the key it sets
    ("web.listen-address: ':9955'\n", r"web.listen-address: unknown key \(did you mean "
     r"listen_address\?\)$"),
    ("'--power.drain-interval': 1\n", r"--power.drain-interval: unknown key \(did you mean "
     r"power_drain_interval_seconds\?\)$"),
    ("fake: yes please\n", r"config.yaml:1: fake: expected true or false"),
    ("sweep_interval_seconds: fast\n", r"config.yaml:1: sweep_interval_seconds: expected a number"),
    ("listen_address: 'nope'\n", r"config.yaml:1: listen_address: .*HOST:PORT"),
    ("log_level: loud\n", r"config.yaml:1: log_level: expected one of"),
    ("a: [\n", r"config.yaml:2: invalid YAML"),
    ("- 1\n- 2\n", r"config.yaml: expected a mapping, got list"),
    ("stale_after_seconds: 1\nsweep_interval_seconds: 2\n", r"stale_after_seconds: must be longer"),
    ("collector_host: maybe\n", r"config.yaml:1: collector_host: expected true or false"),
    ("\nhost_network_exclude: '^(lo'\n",
     r"config.yaml:2: host_network_exclude: invalid regular expression"),
    ("host_network_exclude: 5\n", r"config.yaml:1: host_network_exclude: expected a string"),
    ("hpc_job_mapping_dir: 7\n", r"config.yaml:1: hpc_job_mapping_dir: expected a string"),
    ("hpc_job_mapping_dir: ''\n", r"config.yaml:1: hpc_job_mapping_dir: expected a directory"),
    ("\nkubernetes_pod_labels: 'team|('\n",
     r"config.yaml:2: kubernetes_pod_labels: not a regular expression"),
    ("kubernetes_pod_labels: ''\n", r"config.yaml:1: kubernetes_pod_labels: expected a regular"),
])
def test_bad_config_names_file_line_and_key(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config_file(write(tmp_path, text))


def test_empty_config_file_is_all_defaults(tmp_path):
    assert load_config_file(write(tmp_path, "")) == Config.of()


def test_missing_and_binary_config_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config_file(tmp_path / "absent.yaml")
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not a UTF-8"):
        load_config_file(path)


@pytest.mark.parametrize(("text", "parsed"), [
    (":9955", ("", 9955)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9955", ("::1", 9955)),
])
def test_listen_addresses(text, parsed):
    assert parse_listen_address(text) == parsed


@pytest.mark.parametrize("text", ["9955", "host:", "host:99999", "::1:9955", "h:-1"])
def test_bad_listen_addresses(text):
    with pytest.raises(ConfigError):
        parse_listen_address(text)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_cli_version_and_help():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("cluster-telemetry-exporter 0.")
    result = run_cli("run", "--help")
    assert result.returncode == 0 and "--web.listen-address" in result.stdout


def test_cli_bad_flag():
    assert "unrecognized arguments: --bogus" in one_line_error(run_cli("run", "--bogus"))


def test_cli_bad_flag_value():
    line = one_line_error(run_cli("run", "--fake", "--power.sample-rate", "0"))
    assert "--power.sample-rate" in line and "out of range" in line
    line = one_line_error(run_cli("run", "--fake", "--power.sample-rate", "fast"))
    assert "invalid float value" in line


def test_cli_unknown_scenario():
    line = one_line_error(run_cli("run", "--fake", "--scenario", "nosuch"))
    assert "unknown scenario 'nosuch'" in line and "training" in line


def test_cli_bad_scenario_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("gpus: 4\nworkload:\n  step_period_seconds: -1\n")
    line = one_line_error(run_cli("run", "--fake", "--scenario", str(path)))
    assert "mine.yaml:3: workload.step_period_seconds" in line


@pytest.mark.parametrize("call, hint", [
    ("nvmlDeviceGetFoo", "unknown NVML call 'nvmlDeviceGetFoo' (known: "),
    ("nvmlDeviceGetSample", "(did you mean nvmlDeviceGetSamples?)"),
    ("nvmlDeviceGetHandleByIndex", "(did you mean nvmlDeviceGetHandleByIndex_v2?)"),
    ("nvmlEventSetWait_v2", "blocks by design: a fault there never fires"),
])
def test_a_fault_on_an_unknown_call_is_refused(tmp_path, call, hint):
    # a fault on a call the fake never answers would be accepted and never fire
    path = tmp_path / "mine.yaml"
    path.write_text(f"gpus: 8\nevents:\n  - kind: hang\n    at: 10\n    gpu: 0\n"
                    f"    call: {call}\n    seconds: 20\n  - {{kind: error, at: 1, "
                    f"call: nvmlDeviceGetSamples, error: Unknown}}\n")
    with pytest.raises(ConfigError) as info:
        load_scenario(str(path))
    assert "mine.yaml:6: events.call: " in str(info.value) and hint in str(info.value)
    line = one_line_error(run_cli("run", "--fake", "--scenario", str(path)))
    assert "mine.yaml:6: events.call" in line and hint in line


def test_cli_bad_config_file(tmp_path):
    path = write(tmp_path, "power_sample_rate_hz: 1000\n")
    line = one_line_error(run_cli("run", "--config", str(path)))
    assert "config.yaml:1: power_sample_rate_hz" in line
    assert "power_sample_rate_hz" in one_line_error(run_cli("check-config", str(path)))


def test_cli_check_config_ok(tmp_path):
    result = run_cli("check-config", str(write(tmp_path, "power_sample_rate_hz: 40\n")))
    assert result.returncode == 0 and "ok" in result.stdout and "40 Hz" in result.stdout


def test_cli_without_nvml_explains_how_to_run_the_simulation():
    result = run_cli("run", "--web.listen-address", "127.0.0.1:0")
    assert result.returncode == 1
    assert "NVML is not available" in result.stderr and "run --fake" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_port_in_use(tmp_path):
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_cli("run", "--fake", "--web.listen-address", f"127.0.0.1:{port}")
    assert result.returncode == 1 and "cannot listen" in result.stderr
    assert "Traceback" not in result.stderr


def test_host_and_jobs_collectors(tmp_path):
    from exporter.collectors.registry import enabled

    def names(config) -> list[str]:
        return [spec.name for spec in enabled(config.collectors)]

    assert names(Config.of()) == ["host", "infiniband", "mig", "profiling"]
    path = write(tmp_path, "collector_host: false\nhpc_job_mapping_dir: /run/x\n")
    config = load_config_file(path)
    values = config.values()
    assert not values["collector_host"] and values["hpc_job_mapping_dir"] == "/run/x"
    assert names(config) == ["infiniband", "jobs", "mig", "profiling"]
    config = build_config(str(path), {"collector_host": True, "hpc_job_mapping_dir": None,
                                      "host_network_exclude": "^lo$"})
    values = config.values()
    assert values["collector_host"] and values["hpc_job_mapping_dir"] == "/run/x"
    assert names(config) == ["host", "infiniband", "jobs", "mig", "profiling"]
    with pytest.raises(ConfigError, match="collector_jobs: needs --hpc-job-mapping-dir"):
        load_config_file(write(tmp_path, "collector_jobs: true\n"))


def test_cli_bad_profiling_interval():
    line = one_line_error(run_cli("run", "--fake", "--collector.profiling.interval", "0.1"))
    assert "--collector.profiling.interval" in line and "out of range" in line


def test_cli_bad_network_exclude():
    line = one_line_error(run_cli("run", "--fake", "--collector.host.network-exclude", "(lo"))
    assert "--collector.host.network-exclude" in line and "invalid regular expression" in line


def test_cli_host_and_jobs_flags_parse():
    from exporter.cli import build_parser

    args = build_parser().parse_args(["run", "--no-collector.host", "--hpc-job-mapping-dir",
                                      "/run/j", "--collector.host.network-exclude", "^lo$"])
    assert args.collector_host is False and args.hpc_job_mapping_dir == "/run/j"
    assert args.host_network_exclude == "^lo$"
    assert build_parser().parse_args(["run"]).collector_host is None  # not given: file wins


# ---------------------------------------------------------------- hostile config files


def alias_bomb(key: str = "listen_address") -> str:
    """About 330 bytes that expand to 9**8 strings (the issue's 470-byte bomb: 34 s and a
    MemoryError in check-config, printing the expanded value)."""
    lines = [f"{key}:", '  - &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefg", "bcdefgh", strict=True):
        lines.append(f"  - &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_fails_check_config_in_one_short_line(tmp_path):
    path = write(tmp_path, alias_bomb())
    assert len(path.read_bytes()) < 470
    result = run_cli("check-config", str(path), timeout=60)
    line = one_line_error(result)
    assert "config.yaml:3: invalid YAML: aliases (*a) are not supported" in line
    assert len(line) < 200


def test_aliases_are_refused_everywhere_yaml_is_read(tmp_path):
    with pytest.raises(ConfigError, match="aliases"):
        load_config_file(write(tmp_path, "log_level: &l info\nlisten_address: *l\n"))
    web = tmp_path / "web.yml"
    web.write_text(alias_bomb("basic_auth_users"))
    with pytest.raises(ConfigError, match="aliases"):
        load_web_config(web)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("gpus: &n 4\nexpected_gpus: *n\n")
    with pytest.raises(ConfigError, match="aliases"):
        load_scenario(str(scenario))


def test_an_anchor_without_alias_is_fine(tmp_path):
    assert load_config_file(write(tmp_path, "log_level: &l debug\n")).log.log_level == "debug"


def test_config_reads_are_bounded(tmp_path):
    """`--config /dev/zero` read without end: a device is no config file."""
    line = one_line_error(run_cli("check-config", "/dev/zero"))
    assert "/dev/zero: cannot read: a character device, not a regular file" in line
    big = write(tmp_path, "# " + "x" * (MAX_FILE_BYTES + 10) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_config_file(big)


def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path):
    path = write(tmp_path, "listen_address: " + "[" * 20000 + "]" * 20000 + "\n")
    line = one_line_error(run_cli("check-config", str(path)))
    assert "nested more than 64 levels deep" in line


@pytest.mark.parametrize("text", [
    "listen_address: '" + "a" * 100000 + "'\n",
    "power_sample_rate_hz: [" + ", ".join(["1"] * 20000) + "]\n",
    "log_level: {" + ", ".join(f"k{i}: {i}" for i in range(5000)) + "}\n",
])
def test_error_messages_quote_a_bounded_excerpt(tmp_path, text):
    with pytest.raises(ConfigError) as info:
        load_config_file(write(tmp_path, text))
    message = str(info.value)
    assert len(message) <= MAX_MESSAGE_CHARS and "\n" not in message
    assert "config.yaml:1" in message


def test_config_error_is_one_bounded_line():
    error = ConfigError("first\nsecond " + "x" * 10000)
    assert "\n" not in str(error) and len(str(error)) == MAX_MESSAGE_CHARS


@pytest.mark.parametrize(("args", "code", "command", "needle"), [
    (["run", "--bogus"], 2, "run", "unrecognized arguments: --bogus"),
    (["run", "--config", "{tmp}/absent.yaml"], 2, "run", "cannot read"),
    (["run", "--web.listen-address", "127.0.0.1:0"], 1, "run", "run --fake"),
    (["run", "--fake", "--scenario", "nosuch"], 2, "run", "unknown scenario"),
    (["check-config", "{tmp}/absent.yaml"], 2, "check-config", "cannot read"),
    (["check-config", "{tmp}/typo.yaml"], 2, "check-config", "did you mean log_level?"),
    (["analyze", "{tmp}/absent.csv"], 2, "analyze", "cannot read"),
    (["analyze", "x.csv", "--gpus", "0"], 2, "analyze", "--gpus"),
    (["record", "--fake", "--duration", "0", "--out", "{tmp}/x.cte"], 2, "record",
     "--duration 0"),
    (["record", "--fake", "--duration", "1", "--out", "{tmp}/no/dir/x.cte"], 2, "record",
     "cannot write"),
    (["record", "--duration", "1", "--out", "{tmp}/x.cte"], 1, "record", "add --fake"),
    (["simulate", "--nodes", "0"], 2, "simulate", "--nodes"),
    (["bogus"], 2, None, "invalid choice: 'bogus'"),
])
def test_every_subcommand_reports_errors_in_one_shape(tmp_path, args, code, command, needle):
    """`cluster-telemetry-exporter: SUBCOMMAND: message`, one line, whichever path failed."""
    (tmp_path / "typo.yaml").write_text("log_levl: debug\n")
    result = run_cli(*(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    prefix = f"cluster-telemetry-exporter: {command}: " if command else (
        "cluster-telemetry-exporter: ")
    assert lines[0].startswith(prefix), lines[0]
    assert "error:" not in lines[0] and needle in lines[0], lines[0]


def test_a_duplicate_key_stops_check_config_naming_file_line_and_key(tmp_path):
    path = write(tmp_path, "log_level: info\nsweep_interval_seconds: 1\nlog_level: debug\n")
    line = one_line_error(run_cli("check-config", str(path)))
    assert "config.yaml:3: invalid YAML: duplicate key 'log_level' (first on line 1)" in line
    # and at start, before anything is served
    line = one_line_error(run_cli("run", "--fake", "--config", str(path),
                                  "--web.listen-address", "127.0.0.1:0"))
    assert "config.yaml:3:" in line and "duplicate key 'log_level'" in line


def test_duplicate_keys_are_refused_everywhere_yaml_is_read(tmp_path):
    nested = "collectors:\n  host: true\n  host: false\n"
    with pytest.raises(ConfigError, match="duplicate key"):
        load_config_file(write(tmp_path, nested))
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  alice: $2y$10$x\n  alice: $2y$10$y\n")
    with pytest.raises(ConfigError, match=r"web.yml:3: .*duplicate key 'alice'"):
        load_web_config(web)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("gpus: 4\ngpus: 8\n")
    with pytest.raises(ConfigError, match=r"scenario.yaml:2: .*duplicate key 'gpus'"):
        load_scenario(str(scenario))


def test_keys_that_differ_only_in_type_or_place_are_not_duplicates(tmp_path):
    from exporter.yamlfile import load_yaml

    data = load_yaml("a: {x: 1}\nb: {x: 2}\n1: one\n'1': text\n", "t.yaml")
    assert data["a"]["x"] == 1 and data["b"]["x"] == 2 and data[1] == "one"
    assert data["1"] == "text"


# ---------------------------------------------------------------- special files


def _fifo(tmp_path, name: str):
    path = tmp_path / name
    os.mkfifo(path)
    return path


FIFO_LINE = "named pipe (FIFO), not a regular file"


@pytest.mark.parametrize("how", ["check-config", "run --config", "run --web.config.file",
                                 "run --scenario", "run --replay", "analyze"])
def test_a_fifo_given_by_name_is_refused_at_once(tmp_path, how):
    """A named pipe blocked the read until something wrote to it: for ever."""
    fifo = str(_fifo(tmp_path, "named.yaml"))
    listen = ("--web.listen-address", "127.0.0.1:0")
    args = {
        "check-config": ("check-config", fifo),
        "run --config": ("run", "--config", fifo),
        "run --web.config.file": ("run", "--fake", "--web.config.file", fifo, *listen),
        "run --scenario": ("run", "--fake", "--scenario", fifo, *listen),
        "run --replay": ("run", "--replay", fifo, *listen),
        "analyze": ("analyze", fifo),
    }[how]
    line = one_line_error(run_cli(*args, timeout=60))
    assert f"{fifo}: cannot read: a {FIFO_LINE}" in line


def test_a_fifo_as_a_tls_file_is_refused_at_once(tmp_path):
    fifo = _fifo(tmp_path, "server.crt.fifo")
    key = tmp_path / "server.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {fifo}\n  key_file: {key}\n")
    config = write(tmp_path, f"web_config_file: {web}\n")
    line = one_line_error(run_cli("check-config", str(config), timeout=60))
    assert "web.yml:2: tls_server_config.cert_file:" in line and FIFO_LINE in line


def test_a_path_swapped_for_a_fifo_after_the_check_does_not_hang(tmp_path, monkeypatch):
    from exporter import regularfile

    fifo = _fifo(tmp_path, "swapped.yaml")
    monkeypatch.setattr(regularfile, "check_regular", lambda path: None)  # the race lost
    with pytest.raises(regularfile.NotRegularFile, match="FIFO"):
        regularfile.read_regular(fifo)  # opened without blocking, refused on the descriptor
    regular = write(tmp_path, "log_level: debug\n")
    assert regularfile.read_regular(regular) == b"log_level: debug\n"
    assert regularfile.read_regular(regular, limit=3) == b"log_"  # limit + 1: 'too large'
