"""One word, one meaning (docs/development.md, Glossary): the names the code binds keep the
glossary's words to their one meaning. A name that uses a word for something else fails
here until it is renamed, or listed below with why it may keep the word."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.tools import REPO

PACKAGE = REPO / "exporter"


def bound_names(path: Path, package: Path = PACKAGE) -> set[str]:
    """The names a module binds (functions, classes, arguments, assigned names and
    attributes), and its own path's parts (`metrics/health.py` binds `metrics`, `health`)."""
    names = {part.removesuffix(".py") for part in path.relative_to(package).parts}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def uses(word: str, package: Path = PACKAGE, skip: tuple[str, ...] = ()) -> set[tuple[str, str]]:
    """(module, name) for every bound name holding `word` (any case), outside `skip`."""
    out = set()
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module.startswith(skip):
            continue
        out |= {(module, name) for name in bound_names(path, package)
                if re.search(word, name, re.IGNORECASE)}
    return out


# -- health: the verdict, and only it --------------------------------------------------

VERDICT = "about the verdict"
NVML = "NVML's own name (the fabric health mask)"
DCGM = "dcgm-exporter's health watches, written from the verdict"
PROBE = "the /healthz path (liveness)"
USERS = "a config key users set (--sweep.health-interval)"
HEALTH_NAMES: dict[tuple[str, str], str] = {
    ("app.py", "health"): VERDICT,
    ("config.py", "health"): VERDICT,  # HealthSettings' section
    ("options.py", "HEALTH"): VERDICT,  # the `health` command
    ("history/recorder.py", "health"): VERDICT,
    ("history/recorder.py", "_last_health"): VERDICT,
    ("history/recorder.py", "observe_health"): VERDICT,
    ("metrics/health.py", "health"): VERDICT,
    ("web/api.py", "HEALTH"): VERDICT,
    ("web/api.py", "health"): VERDICT,
    ("web/api.py", "health_body"): VERDICT,
    ("web/findings_hardware.py", "health"): VERDICT,
    ("metrics/compat/dcgm.py", "health"): DCGM,
    ("metrics/compat/dcgm.py", "_health_lines"): DCGM,
    ("metrics/compat/dcgm.py", "HEALTH_CHECKS"): DCGM,
    ("metrics/compat/dcgm.py", "HEALTH_RESULT"): DCGM,
    ("metrics/compat/dcgm.py", "HEALTH_WATCHES"): DCGM,
    ("gpu/board.py", "health_mask"): NVML,
    ("gpu/board.py", "FABRIC_HEALTH_BAD"): NVML,
    ("sim/fake_device.py", "healthMask"): NVML,
    ("sim/fake_device.py", "healthy"): NVML,
    ("web/server.py", "_healthz"): PROBE,
    ("sampling/settings.py", "gpu_health_interval_seconds"): USERS,
}


def test_health_names_only_the_verdict():
    found = uses("health", skip=("health/", "commands/health/"))
    unexplained = found - set(HEALTH_NAMES)
    assert unexplained == set(), "name it for what it is, not 'health'"


def test_every_health_exception_still_exists():
    found = uses("health", skip=("health/", "commands/health/"))
    assert set(HEALTH_NAMES) - found == set()


def test_the_word_check_sees_every_kind_of_name(tmp_path):
    package = tmp_path / "exporter"
    (package / "metrics").mkdir(parents=True)
    (package / "metrics" / "gpu_health.py").write_text(
        "WITH_HEALTH = ()\n"
        "def health_families(snapshot, health_read=None):\n"
        "    self.health_cache = 1\n"
        "class GpuHealthRows: ...\n"
        "snapshot.health\n")  # read, not bound: the binding is where it is defined
    found = {name for _, name in uses("health", package)}
    assert found == {"gpu_health", "WITH_HEALTH", "health_families", "health_read",
                     "health_cache", "GpuHealthRows"}


# -- critical: a severity (an XID's class, a finding's, an alert's), never a band ------------

CRITICAL_NAMES: dict[tuple[str, str], str] = {
    ("gpu/xid.py", "CRITICAL"): "the XID class `critical`",
    ("web/wording.py", "CRITICAL"): "a finding's severity",
}


def test_critical_names_only_a_severity():
    found = uses("critical")
    assert found - set(CRITICAL_NAMES) == set()
    assert set(CRITICAL_NAMES) - found == set()


def test_the_swing_band_is_not_called_critical():
    texts = [*REPO.glob("docs/*.md"), REPO / "README.md", *PACKAGE.rglob("*.py")]
    said = [str(p.relative_to(REPO)) for p in texts
            if re.search(r"critical[ _-]*(band|hz)", p.read_text(), re.IGNORECASE)]
    assert said == []


# -- finding: what the live page and /api/v1/findings say; a straggler's is an outlier ----

PAGE = ("web/",)  # the page's findings and their wording
FINDING_NAMES: dict[tuple[str, str], str] = {
    ("history/answer.py", "replacement_findings"): "the page's finding that a GPU was replaced",
    ("history/answer.py", "REPLACEMENT_FINDING_SECONDS"): "how long the page says it",
}


def test_finding_names_only_what_the_page_says():
    found = uses("finding", skip=PAGE)
    assert found - set(FINDING_NAMES) == set()
    assert set(FINDING_NAMES) - found == set()


# where the sampler's text may say "finding": the page's (the findings' severity)
FINDING_WORDING_IN_SAMPLING = {"settings.py"}


def test_the_sampler_says_outlier_not_finding():
    """A straggler signal held for the persistence is an outlier in the sampler's words;
    the finding is what the page makes of it."""
    said = {p.name for p in (PACKAGE / "sampling").glob("*.py")
            if re.search(r"\bfindings?\b", p.read_text(), re.IGNORECASE)}
    assert said - FINDING_WORDING_IN_SAMPLING == set()


# -- step swing: the swing inside the compute plateaus (find_step_swing); the 30 s window's
# swing (analyse_window) is the window swing, and both are at the step scale ----------------

STEP_SWING_NAMES: dict[tuple[str, str], str] = {
    ("analysis/step_segments.py", "StepSwing"): "what find_step_swing finds",
    ("analysis/step_segments.py", "find_step_swing"): "the step swing's analysis",
    ("offline/swings.py", "merge_step_swings"): "step swings merged into the window swings",
    ("sampling/live_power.py", "step_swing"): "PowerAnalysis' step swing",
}


def test_step_swing_names_only_the_plateaus_swing():
    found = uses("step_?swing")
    assert found - set(STEP_SWING_NAMES) == set()
    assert set(STEP_SWING_NAMES) - found == set()


def test_the_window_swing_thresholds_say_window_swing():
    """--min-band-energy, --min-synchrony and --hold judge the window swing (SwingThresholds,
    SwingDetector), never the step swing; --band is the swing band."""
    from exporter.options import options_of
    from exporter.sampling.settings import PowerSettings

    helps = {o.key: o.help for o in options_of(PowerSettings)}
    for key in ("min_band_energy_ratio", "min_synchrony", "hold_updates"):
        assert helps[key].startswith("window swing: "), (key, helps[key])
    assert helps["band_hz"].startswith("swing band"), helps["band_hz"]


def test_the_live_power_analysis_names_which_swing():
    """PowerAnalysis holds both: the window swing and the step swing, neither a bare swing."""
    from dataclasses import fields

    from exporter.sampling.live_power import PowerAnalysis

    names = {f.name for f in fields(PowerAnalysis)} | set(vars(PowerAnalysis))
    assert {"window_swing", "step_swing"} <= names
    assert "swing" not in names


# -- history: the state directory (history/), nothing else -----------------------------

STATE_DIRECTORY = "the state directory's history"
HISTORY_NAMES: dict[tuple[str, str], str] = {
    ("app.py", "history"): STATE_DIRECTORY,
    ("app.py", "_open_history"): STATE_DIRECTORY,
    ("app.py", "history_problem"): STATE_DIRECTORY,
    ("config.py", "history"): STATE_DIRECTORY,  # HistorySettings' section
    ("web/api.py", "HISTORY"): STATE_DIRECTORY,  # /api/v1/history
    ("web/api.py", "MAX_HISTORY_QUERY_BYTES"): STATE_DIRECTORY,
    ("web/api.py", "_history"): STATE_DIRECTORY,
    ("web/api.py", "history"): STATE_DIRECTORY,
    ("web/server.py", "history"): STATE_DIRECTORY,
}


def test_history_names_only_the_state_directory():
    found = uses("history", skip=("history/", "commands/history.py"))
    assert found - set(HISTORY_NAMES) == set()
    assert set(HISTORY_NAMES) - found == set()


# -- state: a verdict's (ok, warning, failed, unknown); a goodput state, the state directory
# and the driver's or sysfs' states (link, port, P-state) are always named with their word.
# No class is a "state" of its own: what a collector carries between reads is an account.

CLASS_STATES: dict[tuple[str, str], str] = {
    ("commands/health/slurm.py", "NodeState"): "Slurm's node state (sinfo)",
}


def class_names(package: Path = PACKAGE) -> set[tuple[str, str]]:
    return {(path.relative_to(package).as_posix(), node.name)
            for path in sorted(package.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ClassDef)}


def test_no_class_is_a_state_of_its_own():
    found = {(module, name) for module, name in class_names() if "state" in name.lower()}
    assert found - set(CLASS_STATES) == set()
    assert set(CLASS_STATES) - found == set()


# -- action: the verdict's words for what to do (reset_gpu, ...); the driver's recovery
# tokens (gpu_reset, ...) are the driver's, served only on gpu_recovery_action -------------

def test_the_driver_tokens_and_our_actions_are_two_vocabularies():
    from exporter.gpu.fields import DRIVER_RECOVERY_TOKENS
    from exporter.health.model import ACTIONS
    from exporter.sim.scenarios import DRIVER_RECOVERY_CODES

    driver = set(DRIVER_RECOVERY_TOKENS.values())
    assert driver & set(ACTIONS) == {"none"}  # one act, never two spellings in one vocabulary
    # the fake answers each token a scenario names with the driver's own code
    assert {token: DRIVER_RECOVERY_TOKENS[code]
            for token, code in DRIVER_RECOVERY_CODES.items()} == {
        token: token for token in DRIVER_RECOVERY_CODES}


# -- what NVML answers is a device read; the sweep every --sweep.health-interval is the slow
# sweep. Neither is "health" in what people read (docs, docstrings, comments). -------------

def test_raw_reads_and_the_slow_sweep_are_not_called_health():
    texts = [*REPO.glob("docs/*.md"), REPO / "README.md", *PACKAGE.rglob("*.py"),
             *REPO.glob("bench/*.py"), *REPO.glob("scripts/*.py")]
    said = [f"{p.relative_to(REPO)}: {m.group(0)!r}" for p in texts
            for m in re.finditer(r"health[\s-]+read\w*|every\s+health[\s-]+interval|"
                                 r"health[\s-]+interval\s+(batch|fields)|"
                                 r"health\s+and\s+energy\s+at", p.read_text(),
                                 re.IGNORECASE)]
    assert said == []


def test_the_glossary_defines_every_word_held_here():
    text = (REPO / "docs" / "development.md").read_text()
    glossary = text[text.index("## Glossary"):text.index("## Threads")]
    for word in ("health", "device read", "slow sweep", "history", "power ring", "state",
                 "critical", "swing band", "window swing", "step swing", "action", "finding",
                 "outlier", "lost"):
        assert f"**{word}**" in glossary, word
