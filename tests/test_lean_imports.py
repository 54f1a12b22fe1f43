"""`run` loads what it runs and no more: the other commands, the offline analysis and (on
real NVML) the simulator stay unimported, and every command still parses its own flags."""

from __future__ import annotations

import os

import pytest

from exporter.cli import _COMMANDS, main
from tests.tools import fresh_python

_LOADED = ("import sys\n"
           "print(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules if m.startswith("
           "('exporter.commands', 'exporter.offline', 'exporter.sim', 'exporter.fleet'))}))")


def _modules_after(code: str) -> str:
    stdout = fresh_python(code + "\n" + _LOADED, timeout=120)
    return stdout.strip().splitlines()[-1]


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


_HEAPS_AFTER_THREADS = """
import ctypes, sys, tempfile, threading
import numpy as np
from exporter.cli import cap_malloc_arenas
if sys.argv[1] == 'cap':
    assert cap_malloc_arenas()
barrier = threading.Barrier(8)
def work():
    barrier.wait()  # all at once: each would get an arena of its own
    [np.ones(4096) for _ in range(200)]
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile() as out:
    f = libc.fopen(out.name.encode(), b'w')
    libc.malloc_info(0, ctypes.c_void_p(f))
    libc.fclose(ctypes.c_void_p(f))
    print(open(out.name).read().count('<heap nr='))
"""


def _malloc_heaps(mode: str) -> int:
    stdout = fresh_python(_HEAPS_AFTER_THREADS, mode, timeout=60)
    return int(stdout)


def test_run_caps_the_malloc_arenas_its_threads_make():
    import ctypes

    if not hasattr(ctypes.CDLL(None), "malloc_info"):
        pytest.skip("not glibc")
    assert _malloc_heaps("cap") <= 2
    assert _malloc_heaps("free") > 2  # what the cap prevents


def test_the_exporter_loads_two_modules_of_prometheus_client_and_others_get_all_of_it():
    code = ("import sys\nimport exporter.app\n"
            "print(sorted(m for m in sys.modules if m.startswith('prometheus_client')))\n"
            "from prometheus_client import CollectorRegistry, Counter, generate_latest\n"
            "registry = CollectorRegistry()\n"
            "Counter('demo', 'a counter', registry=registry).inc()\n"
            "print(generate_latest(registry).decode().splitlines()[2])\n"
            "import prometheus_client\n"
            "print('generate_latest' in prometheus_client.__all__)")
    stdout = fresh_python(code, timeout=60)
    loaded, sample, listed = stdout.splitlines()
    assert loaded == ("['prometheus_client', 'prometheus_client.metrics_core', "
                      "'prometheus_client.samples', 'prometheus_client.validation']")
    assert sample == "demo_total 1.0"
    assert listed == "True"


def test_an_unknown_name_of_prometheus_client_is_an_attribute_error():
    import prometheus_client

    with pytest.raises(AttributeError):
        prometheus_client.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec("from prometheus_client import no_such_name")


_RESIDENT_AFTER_A_FREED_TEMPORARY = """
import sys
import numpy as np
from exporter.cli import tune_interpreter
if sys.argv[1] == 'tuned':
    tune_interpreter()
def rss():
    return next(int(line.split()[1]) for line in open('/proc/self/status')
                if line.startswith('VmRSS:'))
big = np.ones(2**19)  # 4 MiB, freed: glibc would raise its mmap threshold to it
del big
before = rss()
temporary = np.ones(2**18)  # a 2 MiB temporary, as the analyses make every second
del temporary
print(rss() - before)
"""


def _kib_kept_after_a_temporary(mode: str) -> int:
    stdout = fresh_python(_RESIDENT_AFTER_A_FREED_TEMPORARY, mode, timeout=60)
    return int(stdout)


def test_run_hands_large_temporaries_back_to_the_system():
    import ctypes

    if not hasattr(ctypes.CDLL(None), "mallopt") or not os.path.exists("/proc/self/status"):
        pytest.skip("not glibc on Linux")
    assert _kib_kept_after_a_temporary("tuned") < 512
    assert _kib_kept_after_a_temporary("untuned") > 1024  # what the fixed threshold prevents


def test_a_fake_exporter_without_state_directory_loads_no_sqlite():
    code = ("import sys\nsys.path.insert(0, '.')\nfrom tests.tools import ExporterFactory\n"
            "factory = ExporterFactory()\nexporter = factory.start(manual=True)\n"
            "exporter.sampler.advance(3)\nfactory.stop_all()\n"
            "print('_sqlite3' in sys.modules)\n"
            "from exporter.history.store import Store\nimport tempfile, time\n"
            "store = Store(tempfile.mkdtemp(), time.time)\nstore.open()\n"
            "print('_sqlite3' in sys.modules, type(store.db).__name__)")
    stdout = fresh_python(code, timeout=120)
    assert stdout.splitlines()[-2:] == ["False", "True Connection"]


def test_run_help_names_the_simulators_scenarios_without_loading_it():
    from exporter.cli import _scenario_names
    from exporter.sim.scenarios import builtin_names

    assert _scenario_names() == builtin_names() and "checkpoint-sharded" in builtin_names()


# What a plain-HTTP fake node never needs: OpenSSL (ssl's libssl, hashlib's libcrypto),
# numpy.random, numpy.ma, the idna codec's unicodedata, statistics' decimal and fractions,
# trace loading (a replay's), pkgutil (the collectors are found by a directory scan),
# uuid and its libuuid (the fake's UUIDs are made in exporter/sim/tenants.py).
_NEVER_LOADED = ("_ssl", "_hashlib", "numpy.random", "numpy.ma", "unicodedata", "decimal",
                 "fractions", "exporter.traces.load", "exporter.sim.replay", "pkgutil",
                 "uuid", "_uuid")


def test_a_scraped_fake_node_loads_no_openssl_random_or_masked_arrays():
    # the client: no http.client (it would run ssl first), no name lookup (idna)
    code = ("import socket, sys\n"
            "from exporter.app import Exporter\nfrom exporter.config import Config\n"
            "from exporter.sampling.clock import ManualClock\n"
            "exporter = Exporter(Config.of(listen_address='127.0.0.1:0', fake=True, "
            "fake_costs=False), clock=ManualClock())\n"
            "exporter.start(threads=False)\n"
            "for _ in range(8):\n"
            "    exporter.sampler.advance(7.5)\n"
            "    with socket.socket() as s:\n"
            "        s.connect(('127.0.0.1', exporter.port))\n"
            "        s.sendall(b'GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n'\n"
            "                  b'Accept-Encoding: gzip\\r\\nConnection: close\\r\\n\\r\\n')\n"
            "        reply = b''.join(iter(lambda: s.recv(65536), b''))\n"
            "    assert reply.startswith(b'HTTP/1.0 200') or reply.startswith(b'HTTP/1.1 200')\n"
            "exporter.stop()\n"
            f"print(sorted(m for m in {_NEVER_LOADED!r} if m in sys.modules))")
    stdout = fresh_python(code, timeout=120)
    assert stdout.splitlines()[-1] == "[]"


def test_an_open_live_page_loads_no_masked_arrays():
    # /api/v1/power over more samples than a series holds: decimated, its kept indices
    # made unique by a sort (np.unique would load numpy.ma)
    code = ("import socket, sys\n"
            "from exporter.app import Exporter\nfrom exporter.config import Config\n"
            "from exporter.sampling.clock import ManualClock\n"
            "exporter = Exporter(Config.of(listen_address='127.0.0.1:0', fake=True, "
            "fake_costs=False), clock=ManualClock())\n"
            "exporter.start(threads=False)\n"
            "exporter.sampler.advance(150)\n"
            "with socket.socket() as s:\n"
            "    s.connect(('127.0.0.1', exporter.port))\n"
            "    s.sendall(b'GET /api/v1/power?seconds=150 HTTP/1.1\\r\\nHost: x\\r\\n'\n"
            "              b'Connection: close\\r\\n\\r\\n')\n"
            "    reply = b''.join(iter(lambda: s.recv(65536), b''))\n"
            "assert b' 200 ' in reply.split(b'\\r\\n')[0] and b'\"decimated\": true' in reply\n"
            "exporter.stop()\n"
            "print('numpy.ma' in sys.modules)")
    stdout = fresh_python(code, timeout=120)
    assert stdout.splitlines()[-1] == "False"


def test_ssl_runs_on_its_first_use_and_serves_every_user_as_before():
    code = ("import sys\nimport exporter, http.client\n"
            "from exporter import lazy\n"
            "print(lazy.loaded(sys.modules['ssl']), '_ssl' in sys.modules)\n"
            "import ssl\nfrom ssl import SSLContext, PROTOCOL_TLS_SERVER\n"
            "context = SSLContext(PROTOCOL_TLS_SERVER)\n"
            "print(lazy.loaded(ssl), isinstance(context, ssl.SSLContext),\n"
            "      hasattr(http.client, 'HTTPSConnection'), ssl.TLSVersion['TLSv1_2'].name)")
    stdout = fresh_python(code, timeout=60)
    assert stdout.splitlines() == ["False False", "True True True TLSv1_2"]


# What `run` imports only for the feature that needs it: the history (a state directory),
# dcgm-exporter's families (--metrics.compat), the Kubernetes, jobs and processes
# collectors (their socket, mapping directory or flag), the kernel log (none on the fake),
# the live page and its API (its first request), the web config file's TLS helpers, trace
# errors (a trace read), the "did you mean" of a bad name (difflib), and
# importlib.resources with zipfile (the package's files are read as paths).
_FEATURE_MODULES = (
    "exporter.history.store", "exporter.history.recorder", "exporter.history.writer",
    "exporter.history.families", "exporter.history.answer", "exporter.history.episodes",
    "exporter.history.identities", "exporter.metrics.compat.dcgm",
    "exporter.collectors.kubernetes.reading", "exporter.collectors.kubernetes.apiserver",
    "exporter.collectors.kubernetes.podresources", "exporter.collectors.kubernetes.families",
    "exporter.collectors.jobs.reading", "exporter.collectors.jobs.attributes",
    "exporter.collectors.jobs.families", "exporter.collectors.processes.reading",
    "exporter.collectors.processes.procfs", "exporter.collectors.processes.families",
    "exporter.sampling.kmsg", "exporter.sampling.xid_kmsg", "exporter.web.api", "exporter.web.page",
    "exporter.web.static", "exporter.web.findings", "exporter.web.findings_hardware",
    "exporter.web.wording", "exporter.web.jsonarrays", "exporter.web.gotls",
    "exporter.web.pemsource", "exporter.web.tlsfiles", "exporter.traces.trace", "difflib",
    "csv", "zipfile", "importlib.resources")

# `run --fake` as cli._run builds it (its flags parsed, its config built), on a manual
# clock, scraped over plain sockets; FEATURES: more flags
_RUN_AND_SCRAPE = """
import socket, sys
from exporter.app import Exporter
from exporter.cli import RUN, all_options, build_config, build_parser
from exporter.sampling.clock import ManualClock
args = build_parser(only='run').parse_args(['run', '--fake', '--no-fake.costs',
                                            '--web.listen-address', '127.0.0.1:0',
                                            *FEATURES])
overrides = {o.key: getattr(args, o.key) for o in all_options()
             if o.flag is not None and RUN in o.commands}
exporter = Exporter(build_config(None, overrides), clock=ManualClock())
exporter.start(threads=False)
def get(path):
    with socket.socket() as s:
        s.connect(('127.0.0.1', exporter.port))
        s.sendall(b'GET ' + path.encode() + b' HTTP/1.1\\r\\nHost: x\\r\\n'
                  b'Accept-Encoding: identity\\r\\nConnection: close\\r\\n\\r\\n')
        reply = b''.join(iter(lambda: s.recv(65536), b''))
    status = reply.split(b'\\r\\n', 1)[0]
    assert b' 200 ' in status, (path, status)
    return reply.decode(errors='replace')
"""


def _scraped(features: list[str], then: str) -> list[str]:
    code = (_RUN_AND_SCRAPE.replace("*FEATURES", repr(features)[1:-1] or "")
            + "for _ in range(4):\n    exporter.sampler.advance(7.5)\n"
            "    metrics = get('/metrics')\n" + then + "\nexporter.stop()\n"
            f"print(sorted(m for m in {_FEATURE_MODULES!r} if m in sys.modules))")
    return eval(fresh_python(code, timeout=120).splitlines()[-1])


def test_run_on_a_fake_node_loads_no_feature_it_was_not_asked_for():
    assert _scraped([], "") == []


def test_each_feature_loads_its_modules_when_asked_for_and_works(tmp_path):
    from tests.certs import make_certs

    certs = make_certs(tmp_path / "certs")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
                   f"  key_file: {certs.server_key}\n  cipher_suites: "
                   "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("4242\n")
    kmsg = tmp_path / "kmsg"  # a regular file stands in for /dev/kmsg
    kmsg.write_text("")
    features = ["--storage.path", str(tmp_path / "state"), "--metrics.compat",
                "dcgm-exporter", "--hpc-job-mapping-dir", str(jobs),
                "--collector.kubernetes", "--kubernetes.pod-resources-socket",
                str(tmp_path / "kubelet.sock"), "--collector.processes",
                "--storage.kmsg-path", str(kmsg)]
    # TLS is checked by loading the file (the scrapes here are plain)
    then = ("from exporter.web.webconfig import load_web_config\n"
            f"assert load_web_config({str(web)!r}).tls\n"
            "assert 'DCGM_FI_DEV_POWER_USAGE{' in metrics\n"
            "assert 'gpu_hpc_job_info{' in metrics and 'hpc_job=\"4242\"' in metrics\n"
            "assert 'cte_kubernetes_pod_resources_up 0.0' in metrics\n"
            "assert 'cte_history_' in metrics\n"
            "assert 'gpu_process_memory_used_bytes{' in metrics\n"
            "assert 'cte_kmsg_readable 1.0' in metrics\n"
            "assert '<title>' in get('/')\n"
            "assert '\"findings\"' in get('/api/v1/findings')\n"
            "assert '\"episodes\"' in get('/api/v1/history')\n"
            "assert 'MIT License' in get('/static/uPlot.LICENSE')\n"
            # a misspelt flag ("did you mean"), a trace that cannot be read: one line, exit 2
            "from exporter import cli\n"
            "assert cli.main(['run', '--fakee']) == 2\n"
            "from exporter.traces.trace import TraceError\n"
            "cli._run = lambda args: (_ for _ in ()).throw(TraceError('t.csv:1: bad'))\n"
            "assert cli.main(['run', '--fake']) == 2\n")
    loaded = _scraped(features, then)
    assert loaded == sorted(_FEATURE_MODULES)


def test_the_server_routes_the_page_by_the_prefixes_its_lazy_modules_serve():
    from exporter.web import api, server, static

    assert server.STATIC_PREFIX == static.PREFIX
    assert all(path.startswith(server.API_PREFIX) for path in api.PATHS)


def test_an_unknown_api_path_is_not_found(running_exporter):
    from tests.tools import http_get

    exp = running_exporter.start(manual=True)
    exp.sampler.advance(2)
    resp, body = http_get(exp.port, "/api/v1/nothing")
    assert resp.status == 404 and body == b"not found\n"
