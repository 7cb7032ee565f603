"""End to end: two `trainkit launch` agents on loopback meet at a c10d rendezvous, one
worker each, and survive a killed worker and a lost node (issue 54).

The run is tests/elastic_job.py (a checkpoint after every batch, autoresume). The
rendezvous store is hosted by the test on a port the OS picks (``is_host=0`` for both
agents), as it would be by a node that outlives the others: a test can then lose either
agent. Real processes (each agent and worker imports torch): ~60-80 s for each of the
first two tests on 2 busy cores, ~10 s for the third, which starts no worker.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import elastic_job
from multirank import process_env, run_ranks

JOB = Path(elastic_job.__file__)
DEADLINE = 150  # seconds a test waits for its agents before failing (never a measurement)


def _agents(tmp_path, port, nnodes, *job_args, rdzv_conf=""):
    folder, journal = tmp_path / "ckpt", tmp_path / "journal.jsonl"
    tmp_path.mkdir(exist_ok=True)
    agents = {}
    for node in ("a", "b"):
        command = [
            sys.executable, "-m", "trainkit.cli", "launch", "-n", "1",
            "--nnodes", nnodes, "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "elastic-test", "--max-restarts", "2",
            "--rdzv-conf", f"is_host=0,{rdzv_conf}".rstrip(","),
            str(JOB), str(folder), str(journal), *job_args,
        ]  # fmt: skip
        log = open(tmp_path / f"agent-{node}.log", "w")  # noqa: SIM115 (closed with the process)
        agents[node] = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=process_env(ELASTIC_NODE=node, LOGLEVEL="INFO"),  # the agents' steps, if it fails
        )
        log.close()
    return agents, folder, journal


def _store():
    """The rendezvous store on a free port the OS picks, held by this process."""
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60), multi_tenant=True,
    )  # fmt: skip


def _stop(agents):
    for agent in agents.values():
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def _journal(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _logs(tmp_path):
    return "\n".join(
        f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("agent-*.log"))
    )


def _reference(rank, world, folder, journal):
    torch.set_num_threads(1)
    return elastic_job.train(folder, journal)


def test_a_killed_worker_is_restarted_and_the_run_ends_with_the_uninterrupted_weights(tmp_path):
    uninterrupted = run_ranks(_reference, 2, tmp_path / "ref", tmp_path / "ref.jsonl")[0]
    store = _store()
    agents, folder, journal = _agents(tmp_path / "run", store.port, "2", "--kill-at", "5")
    try:
        codes = {node: agent.wait(timeout=DEADLINE) for node, agent in agents.items()}
    finally:
        _stop(agents)
    assert codes == {"a": 0, "b": 0}, _logs(tmp_path / "run")
    lines = _journal(journal)
    kills = [line for line in lines if line["event"] == "kill"]
    assert [(k["rank"], k["world"], k["batch"]) for k in kills] == [(1, 2, 5)]
    after = lines[lines.index(kills[0]) + 1 :]
    # Both workers started again (rank 1's agent restarted it; rank 0 failed with its peer
    # and was restarted too), met again at world size 2 and resumed from checkpoint 4 (the
    # newest: the kill came before batch 5's save).
    starts = sorted((s["rank"], s["world"], s["batch"]) for s in after if s["event"] == "start")
    assert starts == [(0, 2, 4), (1, 2, 4)], lines
    ends = sorted((e["rank"], e["world"], e["batch"]) for e in after if e["event"] == "end")
    assert ends == [(0, 2, 12), (1, 2, 12)], lines
    assert max(s["restart"] for s in after if s["event"] == "start") >= 1
    assert (folder / "latest").read_text().strip().endswith("-ba12")
    assert torch.equal(torch.load(journal.with_name("final.pt")), uninterrupted)


def test_a_lost_node_leaves_the_other_to_finish_alone_from_the_last_checkpoint(tmp_path):
    # --nnodes 1:2: after node b is lost (its agent and worker SIGKILLed), node a's worker
    # fails on its next collective, its agent restarts it, and the rendezvous closes with
    # the one node left: world size 1, resumed from the newest checkpoint.
    store = _store()
    conf = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=2"
    agents, folder, journal = _agents(tmp_path, store.port, "1:2", "--hold-at", "6", rdzv_conf=conf)
    try:
        deadline, held = time.monotonic() + DEADLINE, []
        while time.monotonic() < deadline and all(a.poll() is None for a in agents.values()):
            held = [line for line in _journal(journal) if line["event"] == "hold"]
            if held:
                break
            time.sleep(0.2)
        assert held, _logs(tmp_path)
        lost = next(node for node, agent in agents.items() if agent.pid == held[0]["agent"])
        survivor = "b" if lost == "a" else "a"
        os.kill(held[0]["agent"], signal.SIGKILL)
        os.kill(held[0]["pid"], signal.SIGKILL)
        code = agents[survivor].wait(timeout=DEADLINE)
    finally:
        _stop(agents)
    assert code == 0, _logs(tmp_path)
    assert agents[lost].returncode == -signal.SIGKILL
    lines = _journal(journal)
    after = lines[lines.index(held[0]) + 1 :]
    starts = [(s["node"], s["world"], s["batch"]) for s in after if s["event"] == "start"]
    ends = [(e["node"], e["world"], e["batch"]) for e in after if e["event"] == "end"]
    assert held[0]["batch"] >= 6 and held[0]["world"] == 2
    assert starts == [(survivor, 1, held[0]["batch"])], lines
    assert ends == [(survivor, 1, 12)], lines
    assert (folder / "latest").read_text().strip().endswith("-ba12")


def test_a_node_alone_when_two_are_needed_gives_up_after_the_join_timeout(tmp_path):
    store = _store()
    result = subprocess.run(
        [
            sys.executable, "-m", "trainkit.cli", "launch", "-n", "1", "--nnodes", "2",
            "--rdzv-endpoint", f"127.0.0.1:{store.port}", "--rdzv-conf", "is_host=0,join_timeout=1",
            str(JOB), str(tmp_path / "ckpt"), str(tmp_path / "journal.jsonl"),
        ],
        capture_output=True, text=True, timeout=DEADLINE, env=process_env(),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert (
        f"trainkit launch: the nodes did not meet at the rendezvous 127.0.0.1:{store.port}: "
        "RendezvousTimeoutError" in result.stderr
    ), result.stderr[-3000:]
    assert not (tmp_path / "journal.jsonl").exists()  # no worker was started
