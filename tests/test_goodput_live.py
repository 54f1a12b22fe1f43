"""The live goodput account on the fake's scenarios, in simulated time: the states add up
to the time since the sampler started on every GPU, and each scenario shows its states."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from exporter.analysis.goodput import STATES
from exporter.commands.analyze import analyse_trace
from exporter.metrics.render import render
from exporter.offline.request import AnalyzeRequest
from exporter.sampling.sampler import SamplerSettings
from exporter.sim.job_story import Story, truth, write_trace
from exporter.sim.scenarios import load_scenario
from exporter.traces.load import load_trace
from exporter.web.findings import findings
from tests.tools import judged, simulated_snapshot

SECONDS = 130.0  # two of checkpoint-stall's minutes
# checkpoint-stall's checkpoints, as the account tells them (its edges take a second)
CHECKPOINTS = r"GPU 0 writes a checkpoint for ~(19|20) s every ~60 s \(2 seen\); the others wait"


def run(name: str, groups: dict[int, str] | None = None):
    def hold(sampler) -> None:
        sampler.job_groups = lambda: groups
    return simulated_snapshot(load_scenario(name), SECONDS,
                              SamplerSettings(xid_events=False, power=None),
                              hold if groups is not None else None)


def by_state(snapshot) -> dict[str, np.ndarray]:
    """Seconds per state, by GPU."""
    account = snapshot.goodput
    return {state: account.seconds[:, i] for i, state in enumerate(STATES)}


@pytest.fixture(scope="module", params=["training", "checkpoint-stall", "checkpoint-sharded",
                                        "gpu-lost", "idle"])
def scenario(request):
    return request.param, run(request.param)


def test_the_states_add_up_to_wall_time_on_every_gpu(scenario):
    _, snap = scenario
    account = snap.goodput
    wall = snap.time - snap.started_at
    assert account.seconds.shape == (8, len(STATES))
    np.testing.assert_allclose(account.seconds.sum(axis=1) + account.pending, wall, atol=1e-6)
    # energy only where there were readings, and never more than the power limit allows
    assert (account.joules.sum(axis=1) <= 700.0 * wall).all()


def test_each_scenario_shows_its_states(scenario):
    name, snap = scenario
    s = by_state(snap)
    wall = snap.time - snap.started_at
    if name == "training":
        assert (s["productive"] >= 0.95 * wall).all()
    elif name == "checkpoint-stall":  # rank 0 writes while its peers wait on it
        assert (s["checkpoint"] >= 35.0).all() and s["stalled"].sum() == 0.0
        assert (s["productive"] >= 0.6 * wall).all()
        # no stall: the stall check counted none, its alerts' gauges stayed 0
        assert snap.straggler_analysis.stalls_total == 0
        assert list(snap.goodput.checkpoints) == ["node"]
        assert re.fullmatch(CHECKPOINTS, snap.goodput.checkpoints["node"])
    elif name == "checkpoint-sharded":  # every GPU near idle together
        assert (s["checkpoint"] >= 35.0).all() and s["stalled"].sum() == 0.0
        assert re.fullmatch(r"all GPUs pause together \(a sharded checkpoint\) for ~(19|20|21) s "
                            r"every ~60 s \(2 seen\)", snap.goodput.checkpoints["node"])
    elif name == "gpu-lost":
        assert s["failed"][5] >= wall - 15.0
        assert s["failed"][[0, 1, 2, 3, 4, 6, 7]].sum() == 0.0
        assert (np.delete(s["productive"], 5) >= 0.95 * wall).all()
        # the steps since the start (no checkpoint yet) on all 8 GPUs, estimated apart
        assert snap.goodput.failures == 1
        assert 8 * 5.0 <= snap.goodput.lost_progress_gpu_seconds <= 8 * 12.0
    else:
        assert s["productive"].sum() == 0.0
    if name != "gpu-lost":
        assert snap.goodput.failures == 0


def test_the_exposition_keeps_a_lost_gpus_series(scenario):
    name, snap = scenario
    text = render(snap).decode()
    uuid = snap.identities[5].uuid
    line = f'gpu_time_seconds_total{{gpu="5",state="failed",uuid="{uuid}"}}'
    # a state's series appears once the GPU spent time in it; productive from the start
    assert (line in text) == (name == "gpu-lost")
    if name == "gpu-lost":
        assert float(text.split(line, 1)[1].split("\n", 1)[0]) > 100.0
    assert 'gpu_time_seconds_total{gpu="0",state="productive"' in text
    assert 'gpu_state_energy_joules_total{gpu="0",state="productive"' in text


def test_gpus_no_job_holds_are_unallocated_and_a_job_starts_on_the_others():
    snap = run("idle", groups={0: "job-1", 1: "job-1", **{g: "unassigned" for g in range(2, 8)}})
    s = by_state(snap)
    assert (s["unallocated"][2:] > 120.0).all() and s["unallocated"][:2].sum() == 0.0
    assert (s["starting"][:2] > 120.0).all()


def test_a_gpu_whose_verdict_is_failed_counts_failed_time(running_exporter):
    """Through the app: the health verdict (one judge) reaches the account. GPU 2's
    uncorrectable ECC error at 12 s fails its verdict; it is not lost."""
    exp = running_exporter.start(manual=True, scenario="ecc-dbe")
    exp.sampler.advance(40)
    snap = exp.current.snapshot
    assert exp.current.verdict.gpus[2].state == "failed" and 2 not in snap.lost
    s = by_state(snap)
    assert s["failed"][2] >= 20.0
    assert s["failed"][[0, 1, 3, 4, 5, 6, 7]].sum() == 0.0


def test_the_failed_state_comes_in_the_same_publish_as_the_verdict(running_exporter):
    """One published value: the snapshot that carries the verdict failing GPU 2 (its
    uncorrectable ECC error at 12 s) already counts GPU 2's newest second failed, not the
    next one; every value before it has no failed time for GPU 2, and every value of the
    verdict and the account is published together."""
    exp = running_exporter.start(manual=True, scenario="ecc-dbe")
    before = exp.current
    for _ in range(40):
        exp.sampler.advance(1)
        now = exp.current
        assert now is not before  # one publish a second
        if now.verdict.gpus[2].state == "failed":
            break
        if now.snapshot.goodput is not None:  # from the stall check's first reads on
            assert by_state(now.snapshot)["failed"][2] == 0.0
        before = now
    else:
        pytest.fail("GPU 2's verdict never failed")
    assert before.verdict.gpus[2].state != "failed"
    assert now.snapshot.goodput.time == now.snapshot.time
    assert by_state(now.snapshot)["failed"][2] > 0.0
    assert by_state(now.snapshot)["failed"][[0, 1, 3, 4, 5, 6, 7]].sum() == 0.0
    # the account served is the published one: metrics, API and page alike
    text = now.body.decode()
    assert 'gpu_time_seconds_total{gpu="2",state="failed",uuid="' in text


def test_live_and_offline_agree_on_a_replayed_job(tmp_path, running_exporter):
    """A synthetic job (start, steps, checkpoints, a stall, idle at the end) replayed at
    speed 1 on a manual clock: the live account finds the truth, as analyze does; the idle
    end is still pending (it is not decided until 15 minutes or the job's end)."""
    story = Story(lost_gpu=None, tail_s=60.0)
    path = write_trace(story, tmp_path / "job.cte")
    want = truth(story)["seconds"]
    exp = running_exporter.start(manual=True, fake=False, replay=str(path))
    exp.sampler.advance(truth(story)["duration"])
    account = exp.sampler.snapshot.goodput
    live = dict(zip(STATES, account.seconds.mean(axis=0), strict=True))
    for state in ("productive", "checkpoint", "stalled", "starting"):
        assert live[state] == pytest.approx(want[state], rel=0.05), state
    assert account.pending == pytest.approx(np.full(4, want["idle"]), abs=5.0)
    offline = analyse_trace(load_trace(str(path)), AnalyzeRequest(str(path)))
    for state in ("productive", "checkpoint", "stalled", "starting"):
        assert live[state] == pytest.approx(
            offline["time_accounting"]["seconds"][state], rel=0.05), state


def _writer(gpu: int, seconds: float):
    """checkpoint-stall with GPU ``gpu`` the one that stops, ``seconds`` into the run."""
    scenario = load_scenario("checkpoint-stall")
    scenario = dataclasses.replace(scenario, workload=dataclasses.replace(
        scenario.workload, checkpoint_gpu=gpu))
    return simulated_snapshot(scenario, seconds, SamplerSettings(xid_events=False, power=None))


def test_a_gpu_other_than_the_first_rank_stopping_in_rhythm_is_a_stall():
    snap = _writer(3, SECONDS)
    s = by_state(snap)
    assert (s["stalled"] >= 30.0).all() and s["checkpoint"].sum() == 0.0
    assert snap.straggler_analysis.stalls_total >= 2


def test_the_page_says_who_writes_a_checkpoint_while_it_is_written():
    snap = _writer(0, 170.0)  # inside the third checkpoint (160-180 s from the start)
    stall = snap.straggler_analysis.stall
    assert stall.cause == "checkpoint" and not stall.stalled and stall.culprit_gpus == (0,)
    found = [f for f in findings(judged(snap)) if f["kind"] in ("checkpoint", "stall")]
    assert [(f["kind"], f["severity"], f["gpu"]) for f in found] == [("checkpoint", "info", 0)]
    assert re.match(CHECKPOINTS, found[0]["message"])
    text = render(snap).decode()
    assert "gpu_node_collective_stall_active 0.0" in text
    assert 'gpu_collective_stall_culprit{gpu="0"' in text
    assert not any(line.startswith("gpu_collective_stall_culprit{") and line.endswith(" 1.0")
                   for line in text.splitlines())


def test_the_processes_ranks_name_the_writer():
    """The processes say GPU 0 holds rank 5 and GPU 4 rank 0: GPU 0 stopping is then a
    fault (rank 0 writes nothing there), a stall."""
    ranks = {0: 5, 1: 1, 2: 2, 3: 3, 4: 0, 5: 6, 6: 7, 7: 4}

    def hold(sampler) -> None:
        sampler.gpu_ranks = lambda: ranks
    snap = simulated_snapshot(load_scenario("checkpoint-stall"), SECONDS,
                              SamplerSettings(xid_events=False, power=None), hold)
    s = by_state(snap)
    assert (s["stalled"] >= 30.0).all() and s["checkpoint"].sum() == 0.0


def test_rank_0_writing_its_checkpoints_is_no_straggler():
    """Past the straggler persistence (300 s), rank 0's checkpoints (20 s of every
    minute at 0 % utilization) would make it a utilization straggler: windows that hold a
    checkpoint update no finding."""
    snap = _writer(0, 420.0)
    report = snap.straggler_analysis.report
    assert report is not None and not any(g.straggler for g in report.gpus.values())
    assert snap.straggler_analysis.stalls_total == 0
