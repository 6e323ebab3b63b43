"""`rcdiag score --ray` on a local 2-CPU Ray cluster with the sample (or a tiny config-built) model.

One pipeline run with 2 engine actors, during which the test kills one busy engine actor (`ray.kill`, restart
allowed): the run still completes, with exactly the local path's (prompt, sample) sequences — none lost or
doubled. Token level: both paths generate shard by shard with the same per-request seeds, so the batches hold
the same requests; but the actors run torch with 1 thread (Ray's OMP_NUM_THREADS for a fractional CPU) and the
local engine with 2, so reduction order may differ in the last bits and, rarely, flip a sampled token after
which the sequence diverges. Hence: identical keys, near-identical log-probs on identical token sequences, and
metrics inside the local run's 95% bootstrap intervals. Then a resume through a `file://` URI rewrites only the
shards that were missing (it runs before the local path's in-process engine is built: one vLLM user at a time).
"""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rcdiag.distributed.score import EngineActor, score_on_ray
from rcdiag.report.build import build_report
from rcdiag.report.options import ReportOptions
from rcdiag.score.generate import GenerateConfig, generate_run
from rcdiag.score.rescore import RescoreConfig, rescore_run
from rcdiag.store.files import MANIFEST_NAME, PENDING_NAME, SEQUENCES_DIR, shard_name
from rcdiag.store.run import open_run

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
CONFIG = GenerateConfig(n=2, max_tokens=24, shard_prompts=1, limit=6, engine_dtype="float32", seed=7)
PROMPTS = Path(__file__).resolve().parents[2] / "sample_data" / "prompts.jsonl"


HANDSHAKE_TIMEOUT_S = 300.0
"""How long an announced engine waits for the kill before giving up (the test then fails: no kill landed)."""


class Registry:
    """Named actor, the handshake: engine actors announce themselves when they start a shard and wait there
    until the test has sent its kill, so the kill always lands mid-shard however loaded the machine is."""

    def __init__(self) -> None:
        self.busy: list[Any] = []
        self.killed = False

    def announce(self, handles: list[Any]) -> None:
        self.busy.extend(handles)

    def take(self) -> list[Any]:
        return self.busy[:1]

    def mark_killed(self) -> None:
        self.killed = True

    def kill_sent(self) -> bool:
        return self.killed


class AnnouncingEngine(EngineActor):
    """The real engine actor; its first shard announces it, then waits for the test's kill (the handshake).
    A restarted actor announces again but finds the kill sent and goes on."""

    first = True

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        import time

        import ray

        if self.first:
            self.first = False
            registry = ray.get_actor("rcdiag-test-registry")
            registry.announce.remote([ray.get_runtime_context().current_actor])
            deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
            while not ray.get(registry.kill_sent.remote()) and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().__call__(batch)


def _kill_first_busy_engine(ray: Any, registry: Any, killed: list[Any], stop: threading.Event) -> None:
    while not stop.is_set() and not killed:
        handles = ray.get(registry.take.remote())
        if handles:
            ray.kill(handles[0], no_restart=False)
            killed.append(handles[0])
            ray.get(registry.mark_killed.remote())  # releases the other announced engine
        stop.wait(0.2)


@pytest.fixture(scope="module")
def ray_run(ray_cluster: Any, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list]:
    """The Ray-scored run, and the engine actors killed during it."""
    out = tmp_path_factory.mktemp("ray_score") / "run"
    registry = ray_cluster.remote(Registry).options(name="rcdiag-test-registry", num_cpus=0).remote()
    killed: list[Any] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_busy_engine, args=(ray_cluster, registry, killed, stop))
    killer.start()
    try:
        score_on_ray(model_dir, PROMPTS, str(out), CONFIG, RescoreConfig(), engines=2, silent=True,
                     engine_class=AnnouncingEngine)
    finally:
        stop.set()
        killer.join()
        ray_cluster.kill(registry)
    return open_run(out), killed


@pytest.fixture(scope="module")
def local_run(ray_run: Any, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same settings through the local path (after the Ray run: one vLLM engine at a time)."""
    out = tmp_path_factory.mktemp("local_score") / "run"
    generate_run(model_dir, PROMPTS, out, CONFIG, silent=True)
    rescore_run(out, RescoreConfig(), silent=True)
    return open_run(out)


def test_killed_engine_run_completes_without_lost_or_doubled_sequences(ray_run: tuple[Any, list]) -> None:
    run, killed = ray_run
    assert len(killed) == 1
    sequences = run.sequences()
    assert sorted(sequences["seq_id"]) == list(range(6 * CONFIG.n))
    tokens = run.tokens()
    assert not tokens.duplicated(["seq_id", "pos"]).any()
    lengths = tokens.groupby("seq_id").size().reindex(sequences["seq_id"], fill_value=0).to_numpy()
    assert (lengths == sequences["response_len"].to_numpy()).all()
    assert tokens["train_logprob"].notna().all() and tokens["rollout_logprob"].notna().all()
    assert run.manifest["counts"] == {"sequences": 12, "tokens": len(tokens), "shards": 6}
    assert run.manifest["trainer"]["dtype"] == "float32" and run.manifest["engine"]["n"] == CONFIG.n


def test_resume_through_file_uri_rewrites_only_missing_shards(ray_cluster: Any, ray_run: tuple[Any, list],
                                                              model_dir: Path, tmp_path: Path) -> None:
    """An interrupted run (pending.json, no manifest, shards 2 and 4 missing) resumed via file://."""
    original = ray_run[0]
    copy = tmp_path / "run"
    shutil.copytree(original.path, copy)
    spec = json.loads((copy / MANIFEST_NAME).read_text())["spec"]
    (copy / MANIFEST_NAME).unlink()
    (copy / PENDING_NAME).write_text(json.dumps({"spec": spec}))
    for k in (2, 4):
        (copy / SEQUENCES_DIR / shard_name(k)).unlink()
    manifest = score_on_ray(model_dir, PROMPTS, f"file://{copy}", CONFIG, RescoreConfig(), engines=1, silent=True)
    assert manifest["distributed"]["shards_this_run"] == [2, 4]
    rates = {k: v for k, v in manifest["distributed"].items() if k.endswith("_per_actor")}
    print(f"\nthroughput (response tokens/s per actor, 1-thread actors): {rates}")
    assert all(v is not None and v > 0 for v in rates.values()) and len(rates) == 2
    assert not (copy / PENDING_NAME).exists()
    resumed = open_run(copy)
    assert resumed.manifest["counts"]["sequences"] == 12
    before, after = original.sequences(), resumed.sequences()
    assert after["seq_id"].tolist() == before["seq_id"].tolist()
    assert not resumed.tokens().duplicated(["seq_id", "pos"]).any()
    again = score_on_ray(model_dir, PROMPTS, f"file://{copy}", CONFIG, RescoreConfig(), engines=1, silent=True)
    assert again["distributed"]["shards_this_run"] == []  # complete: nothing regenerated, no engine started


def test_same_sequences_as_local_path(ray_run: tuple[Any, list], local_run: Any) -> None:
    ray_seqs = ray_run[0].sequences().set_index("seq_id").sort_index()
    local_seqs = local_run.sequences().set_index("seq_id").sort_index()
    key = ["prompt_id", "sample_index", "prompt_text"]
    assert ray_seqs[key].equals(local_seqs[key])
    assert ray_seqs["prompt_token_ids"].map(list).tolist() == local_seqs["prompt_token_ids"].map(list).tolist()
    ray_tok, local_tok = ray_run[0].tokens(), local_run.tokens()
    same = [s for s in ray_seqs.index if np.array_equal(ray_tok.token_id[ray_tok.seq_id == s],
                                                          local_tok.token_id[local_tok.seq_id == s])]
    assert len(same) >= len(ray_seqs) // 2, f"only {len(same)} of {len(ray_seqs)} sequences sampled alike"
    for column in ("rollout_logprob", "train_logprob"):
        a = ray_tok[ray_tok.seq_id.isin(same)][column].to_numpy(np.float64)
        b = local_tok[local_tok.seq_id.isin(same)][column].to_numpy(np.float64)
        assert np.abs(a - b).max() < 1e-3, column


def test_metrics_within_local_bootstrap_intervals(ray_run: tuple[Any, list], local_run: Any) -> None:
    options = ReportOptions(replicates=400)
    local = build_report(local_run, options)
    remote = build_report(ray_run[0], options)
    checked = 0
    for name, interval in local.intervals.items():
        if np.isfinite(interval["low"]) and name in remote.metrics:
            slack = 1e-9 + 1e-6 * abs(interval["high"])
            assert interval["low"] - slack <= remote.metrics[name] <= interval["high"] + slack, name
            checked += 1
    assert checked >= 3
