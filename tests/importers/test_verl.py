"""verl importer: a pickled DataProto (stand-in class under verl's module path, then made un-importable)."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from rcdiag.errors import InputError
from rcdiag.importers import ImportOptions, import_run
from tests.importers.dumps import assert_run_matches, make_truth, pickle_dump, save_verl, verl_tensors

OK = ImportOptions(allow_pickle=True, quiet=True)


def test_dataproto_without_verl_installed(tmp_path):
    """The class verl.protocol.DataProto is not importable at load time: the restricted unpickler maps it."""
    truth = make_truth(seed=20, n=8)
    save_verl(tmp_path / "dump/exp/GBS8_N2/7/gen_batch.dp", truth, tmp_path / "pkgs", step=7)
    assert "verl" not in sys.modules
    run, imported = import_run("verl", tmp_path / "dump", tmp_path / "run", OK)
    assert_run_matches(run, truth)
    seqs = run.sequences()
    assert seqs["step"].tolist() == [7] * 8
    assert seqs["prompt_id"].tolist() == [f"uid-{i // 2}" for i in range(8)]
    source = run.manifest["source"]
    assert source["kind"] == "imported:verl"
    assert "right-padded" in source["conventions"]["padding"]
    assert "0.0" in source["conventions"]["placeholder"]
    assert source["conventions"]["meta_info"] == {"temperature": 1.0}
    masked = sum(int((t.mask == 0).sum()) for t in truth)
    assert masked > 0 and source["mask_counts"] == {"masked_tokens": masked, "placeholder_zeros_masked": masked,
                                                    "zero_rollout_logprobs_valid": 0}


def test_tensordict_batch(tmp_path):
    truth = make_truth(seed=21)
    file = save_verl(tmp_path / "gen_batch.dp", truth, tmp_path / "pkgs", tensordict=True)
    run, _ = import_run("verl", file, tmp_path / "run", OK)
    assert_run_matches(run, truth)


def test_cache_without_old_log_probs_says_so(tmp_path):
    """The SkipManager cache has no trainer side: train_logprob null and `lacks` names old_log_probs."""
    truth = make_truth(seed=22)
    file = save_verl(tmp_path / "gen_batch.dp", truth, tmp_path / "pkgs", drop=("old_log_probs",))
    run, imported = import_run("verl", file, tmp_path / "run", OK)
    assert_run_matches(run, truth, train=False)
    assert any(item.startswith("old_log_probs") for item in run.manifest["source"]["lacks"])


def test_plain_dict_of_tensors_torch_save_and_pickle(tmp_path):
    truth = make_truth(seed=23)
    tensors = verl_tensors(truth)
    torch.save(tensors, tmp_path / "batch.pt")
    run, _ = import_run("verl", tmp_path / "batch.pt", tmp_path / "run1", OK)
    assert_run_matches(run, truth)
    pickle_dump(tmp_path / "batch.pkl", tensors)
    run, _ = import_run("verl", tmp_path / "batch.pkl", tmp_path / "run2", OK)
    assert_run_matches(run, truth)


def test_without_attention_mask_uses_response_mask(tmp_path):
    """Lengths from the last nonzero response_mask entry (tool spans inside stay, mask False); no prompts."""
    truth = make_truth(seed=24)
    for t in truth:  # a trailing masked token would be indistinguishable from padding without attention_mask
        t.mask[-1:] = 1
    tensors = {k: v for k, v in verl_tensors(truth).items() if k not in {"attention_mask", "prompts"}}
    torch.save(tensors, tmp_path / "b.pt")
    run, _ = import_run("verl", tmp_path / "b.pt", tmp_path / "run", OK)
    assert_run_matches(run, truth, prompts=False)


@pytest.mark.parametrize(("edit", "message", "field"), [
    (lambda t: t.__setitem__("rollout_log_probs", t["rollout_log_probs"][:, :-1]), r"\(-1 pattern",
     "rollout_log_probs"),
    (lambda t: t.__setitem__("old_log_probs", torch.cat([t["old_log_probs"], t["old_log_probs"][:, :1]], 1)),
     r"\(\+1 pattern", "old_log_probs"),
    (lambda t: t.pop("responses"), "no 'responses' tensor", "responses"),
    (lambda t: t.__setitem__("response_mask", t["response_mask"][:3]), "batch sizes differ", "response_mask"),
    (lambda t: t.__setitem__("responses", t["responses"][0]), "expected a \\[batch, length\\]", "responses"),
])
def test_bad_tensors(tmp_path, edit, message, field):
    tensors = verl_tensors(make_truth(seed=25))
    edit(tensors)
    torch.save(tensors, tmp_path / "b.pt")
    with pytest.raises(InputError, match=message) as info:
        import_run("verl", tmp_path / "b.pt", tmp_path / "run", OK)
    assert info.value.field == field and info.value.file == str(tmp_path / "b.pt")
    assert not (tmp_path / "run").exists()


def test_refuses_without_allow_pickle_and_truncated_file(tmp_path):
    file = save_verl(tmp_path / "gen_batch.dp", make_truth(seed=26), tmp_path / "pkgs")
    with pytest.raises(InputError, match="pickle-based.*--allow-pickle"):
        import_run("verl", file, tmp_path / "run", ImportOptions(quiet=True))
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="cannot read the dump"):
        import_run("verl", file, tmp_path / "run", OK)
    assert not (tmp_path / "run").exists()


def test_object_arrays_and_multiple_steps(tmp_path):
    """Two step folders (meta.json) import in step order; non_tensor_batch object arrays load."""
    a, b = make_truth(seed=27, n=4), make_truth(seed=28, n=5)
    save_verl(tmp_path / "d/12/gen_batch.dp", b, tmp_path / "pkgs", step=12)
    save_verl(tmp_path / "d/3/gen_batch.dp", a, tmp_path / "pkgs", step=3)
    run, _ = import_run("verl", tmp_path / "d", tmp_path / "run", OK)
    assert_run_matches(run, a + b)
    assert run.sequences()["step"].tolist() == [3] * 4 + [12] * 5
    assert np.isfinite(run.tokens()["rollout_logprob"]).all()


def test_rows_count_from_one(tmp_path):
    """A NaN on a valid token of batch index i is reported as row i + 1 (rows count from 1 in every importer)."""
    truth = make_truth(seed=29)
    tensors = verl_tensors(truth)
    mask = tensors["response_mask"].numpy()
    index = next(i for i in range(1, mask.shape[0]) if mask[i].any())
    tensors["rollout_log_probs"][index, int(np.flatnonzero(mask[index])[0])] = float("nan")
    torch.save(tensors, tmp_path / "b.pt")
    _, imported = import_run("verl", tmp_path / "b.pt", tmp_path / "run", OK)
    assert any(f" row {index + 1}: rollout_logprobs is nan" in w for w in imported.warnings), imported.warnings
