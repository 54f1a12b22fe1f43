"""The README's two quick starts, as written, as far as they run without a GPU node, root or
a cluster: each at most ten lines; the files they install are the repository's and are
valid (the config passes check-config, with the Slurm job mapping on and the commented
compat line valid when uncommented); the `helm template` recipe renders the chart with
dcgm-exporter compatibility on; the Kubernetes lines name the chart's real objects.
(The wheel build of the first line is tests/test_package.py's.)"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
import yaml

from tests.tools import REPO, require_module

README = (REPO / "README.md").read_text()


def block(heading: str, index: int = 0) -> list[str]:
    section = README.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    return blocks[index].splitlines()


SLURM = block("Quick start: a Slurm node with systemd")
KUBERNETES = block("Quick start: Kubernetes, beside or instead of the GPU Operator's "
                   "dcgm-exporter")
TEMPLATE = block("Quick start: Kubernetes, beside or instead of the GPU Operator's "
                 "dcgm-exporter", 1)


def test_the_quick_starts_come_first_and_are_ten_lines_each():
    assert README.index("## Quick start: a Slurm node") < README.index("**Try it**")
    assert len(SLURM) <= 10 and len(KUBERNETES) + len(TEMPLATE) <= 10


def test_the_slurm_quick_start_builds_as_the_tested_install_does():
    from tests.test_package import readme_install_lines

    assert SLURM[0] == readme_install_lines()[0]  # run by tests/test_package.py
    assert "dist/cluster_telemetry_exporter-*.whl" in SLURM[1]


def test_the_slurm_quick_start_installs_files_that_exist_and_a_valid_config(tmp_path):
    for line in SLURM:
        for word in shlex.split(line):
            if word.startswith("deploy/"):
                assert (REPO / word).is_file(), word
    assert any("deploy/slurm/prolog.sh" in line for line in SLURM)
    config = (REPO / "deploy" / "config.yaml").read_text()
    jobs = "/run/cluster-telemetry-exporter/hpc-jobs"
    assert yaml.safe_load(config)["hpc_job_mapping_dir"] == jobs
    # the prolog's default directory is the config's
    assert jobs in (REPO / "deploy" / "slurm" / "prolog.sh").read_text()
    compat = tmp_path / "config.yaml"
    compat.write_text(config.replace("# metrics_compat: dcgm-exporter",
                                     "metrics_compat: dcgm-exporter"))
    assert yaml.safe_load(compat.read_text())["metrics_compat"] == "dcgm-exporter"
    for path in (REPO / "deploy" / "config.yaml", compat):
        result = subprocess.run([sys.executable, "-m", "exporter", "check-config", str(path)],
                                capture_output=True, text=True, cwd=REPO)
        assert result.returncode == 0, result.stderr
        assert "jobs" in result.stdout


def test_the_helm_template_recipe_renders_with_compat_on():
    helm = require_module("helm_python")
    helm.disable_logging()
    (line,) = TEMPLATE
    words = shlex.split(line.split(">")[0])
    assert words[:4] == ["helm", "template", "gpu-telemetry",
                         "deploy/helm/cluster-telemetry-exporter"]
    values: dict = {}
    for i, word in enumerate(words):
        if word == "--set":
            key, value = words[i + 1].split("=", 1)
            *path, last = key.split(".")
            node = values
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
    namespace = words[words.index("-n") + 1]
    with helm.Chart.load(REPO / words[3]) as chart:
        rendered = chart.render(values, name=words[2], namespace=namespace)
    docs = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert f"daemonset/{daemonset['metadata']['name']}" in " ".join(KUBERNETES)
    (exporter,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "exporter"]
    assert "--metrics.compat=dcgm-exporter" in exporter["args"]


@pytest.mark.parametrize("line", [line for line in KUBERNETES if "helm install" in line])
def test_the_install_line_sets_values_the_chart_has(line):
    schema = yaml.safe_load((REPO / "deploy/helm/cluster-telemetry-exporter/values.schema.json")
                            .read_text())
    words = shlex.split(line)
    for i, word in enumerate(words):
        if word == "--set":
            node = schema
            for part in words[i + 1].split("=", 1)[0].split("."):
                props = node.get("properties", {})
                assert part in props or node.get("additionalProperties") not in (False, None), (
                    words[i + 1])
                node = props.get(part, {})


def test_the_helm_lines_say_what_installs_helm():
    """No helm binary comes with the repository (the tests render through
    helm-python-sdk): the sentence before the `helm template` recipe says where Helm's own
    install guide is."""
    section = README.split("## Quick start: Kubernetes", 1)[1].split("\n## ", 1)[0]
    before = section[:section.index("helm template")].rsplit("```sh", 1)[0]
    lead = before.strip().rsplit("\n\n", 1)[-1]
    assert "https://helm.sh/docs/intro/install/" in lead, lead
