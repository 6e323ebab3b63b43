"""verl importer on RolloutSkip dumps in verl's real bytes (tests/importers/verl_dumps.py): DataProto state =
(torch.save bytes of a consolidated TensorDict | numpy encoding, non_tensor_batch, meta_info)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import rcdiag
from rcdiag.errors import InputError
from rcdiag.importers import ImportOptions, import_run
from tests.importers.dumps import assert_run_matches, make_truth
from tests.importers.verl_dumps import save_rollout_skip

OK = ImportOptions(allow_pickle=True, quiet=True)


def test_rollout_skip_dump_with_consolidated_tensordict(tmp_path):
    """Two steps of a real RolloutSkip layout import in step order, values exact, uid/score/meta carried; neither
    verl nor tensordict is needed to read them (the loader reads the zip itself)."""
    pytest.importorskip("tensordict", reason="the fixture writer needs tensordict to produce verl's bytes")
    first, second = make_truth(seed=40, n=6), make_truth(seed=41, n=6)
    save_rollout_skip(tmp_path / "dump", second, tmp_path / "pkgs", gen_step=2, train_step=2)
    save_rollout_skip(tmp_path / "dump", first, tmp_path / "pkgs", gen_step=1, train_step=1)
    assert "verl" not in sys.modules
    run, imported = import_run("verl", tmp_path / "dump", tmp_path / "run", OK)
    assert_run_matches(run, first + second)
    seqs = run.sequences()
    assert seqs["step"].tolist() == [1] * 6 + [2] * 6
    assert seqs["prompt_id"].tolist()[:6] == [f"uid-{i // 2}" for i in range(6)]
    assert seqs["reward"].tolist()[:3] == pytest.approx([0.0, 0.1, 0.2])
    assert run.manifest["source"]["conventions"]["meta_info"] == {"temperature": 1.0}
    metrics = rcdiag.compute_metrics(run, keys="verl")
    assert np.isfinite(metrics["rollout_corr/kl"])


def test_rollout_skip_numpy_serialisation_and_bf16(tmp_path, monkeypatch):
    """VERL_DATAPROTO_SERIALIZATION_METHOD=numpy: (batch_size, device, {key: (dtype, shape, bytes)}); bf16
    old_log_probs widen to float32 exactly."""
    truth = make_truth(seed=42, n=5)
    file = save_rollout_skip(tmp_path / "dump", truth, tmp_path / "pkgs", gen_step=3, numpy_method=True,
                             bf16_old=True, monkeypatch=monkeypatch)
    run, _ = import_run("verl", file, tmp_path / "run", OK)
    import torch

    for t in truth:
        t.train = torch.from_numpy(t.train).to(torch.bfloat16).float().numpy()
    assert_run_matches(run, truth)
    assert run.sequences()["step"].tolist() == [3] * 5


def test_truncated_inner_batch_is_named(tmp_path):
    """A gen_batch.dp whose inner torch.save bytes are cut: InputError naming the file and the batch field."""
    pytest.importorskip("tensordict")
    file = save_rollout_skip(tmp_path / "dump", make_truth(seed=43, n=3), tmp_path / "pkgs")
    import pickle

    from rcdiag.importers.safeload import load_pickle_file

    state = load_pickle_file(file)._state
    broken = tmp_path / "broken" / "gen_batch.dp"
    broken.parent.mkdir()
    with open(broken, "wb") as handle:  # the same pickle structure, inner bytes cut short
        pickle.dump({"batch": None}, handle)
    from rcdiag.importers.tensordicts import load_tensordict_bytes

    with pytest.raises(InputError, match="field 'batch'.*cannot read the DataProto's tensor batch"):
        load_tensordict_bytes(state[0][: len(state[0]) // 2], broken)
    with pytest.raises(InputError, match="tensor batch"):
        import_run("verl", broken, tmp_path / "run", OK)
