"""verl's TensorDict batch (the torch.save bytes inside a pickled DataProto) against hostile files, through the real
CLI in a subprocess: a tensor's offset, size and stride come from the file, and the reader used to hand them to
`as_strided` unchecked — a 451-byte gen_batch.dp crashed the interpreter, a crafted `rollout_log_probs` imported
with exit 0 holding the process's heap memory, and an error message printed a heap pointer. Every tensor is now
made by the one bounds-checked rebuilder (rcdiag.importers.tensors), members are read once, stored only, within
the file's budget."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import rcdiag
from tests.fixtures.cli import assert_user_error, run_cli
from tests.importers.crafted import Pid, dataproto, storage, tensor, torch_zip, uids, verl_batch

RSS_MB = 400
"""Peak memory a refused import may reach: the interpreter with numpy, pyarrow and torch (~155 MiB here) plus room;
the hostile files below took 590 MiB (deflated member) and 2.1 GiB (4,000 references) before."""


def _write(tmp_path, obj, storages, **zip_options) -> str:
    file = tmp_path / "gen_batch.dp"
    file.write_bytes(dataproto((torch_zip(obj, storages, **zip_options), uids(2), {})))
    return str(file)


def _import(file: str, out) -> object:
    return run_cli(["import", "verl", file, "--out", str(out), "--allow-pickle", "-q"])


def test_honest_crafted_batch_imports_exactly(tmp_path):
    """Control: the crafted batch without a hostile change imports, values exact (so each refusal below is caused
    by the one crafted tensor, not by the way these files are made)."""
    obj, storages = verl_batch()
    result = _import(_write(tmp_path, obj, storages), tmp_path / "run")
    assert result.rc == 0, result.text
    tokens = rcdiag.open_run(tmp_path / "run").tokens()
    want = np.frombuffer(storages["3"], np.float32)
    np.testing.assert_array_equal(tokens["rollout_logprob"].to_numpy(np.float32), want)
    assert tokens["token_id"].tolist() == np.frombuffer(storages["0"], np.int64).tolist()


# offset, size, stride of a float32 `rollout_log_probs` over its storage of `numel` elements
HOSTILE = {
    "storage_too_short": (0, (2, 4), (4, 1), 1),  # reads 7 floats past the storage: heap memory as log-probs
    "huge_stride": (0, (2, 4), (2 ** 40, 1), 8),  # reads 4 TiB away: a crash
    "huge_offset": (2 ** 40, (2, 4), (4, 1), 8),
    "negative_stride": (7, (2, 4), (-4, -1), 8),  # reads before the storage
    "expanded_view": (0, (2, 4), (0, 0), 1),  # 8 elements standing on 1: what an importer copies, the file lacks
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_tensor_outside_its_storage_is_refused(tmp_path, case):
    offset, size, stride, numel = HOSTILE[case]
    obj, storages = verl_batch()
    storages["3"] = storages["3"][: numel * 4]
    obj["rollout_log_probs"] = tensor(storage("3", numel), offset, size, stride)
    file = _write(tmp_path, obj, storages)
    result = _import(file, tmp_path / "run")
    assert_user_error(result, file, "field 'batch'")
    assert any(word in result.err for word in ("reaches element", "non-negative", "overlapping")), result.err
    assert not (tmp_path / "run").exists()


def test_error_messages_carry_no_address(tmp_path):
    """A malformed storage reference used to be printed with repr() — `<… _Storage object at 0x7f…>`, a heap
    pointer of the running process."""
    obj, storages = verl_batch()
    obj["rollout_log_probs"] = tensor(Pid(("storage", torch.FloatStorage)), 0, (2, 4), (4, 1))
    file = _write(tmp_path, obj, storages)
    assert_user_error(_import(file, tmp_path / "run"), file, "storage")


def test_deflated_member_is_never_inflated(tmp_path):
    """A 256 MiB storage deflated to ~256 KiB: the reader inflated it (2 MB → 6.4 GB in the report); torch.save never
    compresses, so a compressed member is refused before a byte of it is inflated."""
    obj, storages = verl_batch()
    storages["9"] = bytes(256 << 20)
    obj["extra"] = tensor(storage("9", 64 << 20), 0, (64 << 20,), (1,))
    file = _write(tmp_path, obj, storages, deflate=("9",))
    assert (tmp_path / "gen_batch.dp").stat().st_size < 2 << 20
    result = _import(file, tmp_path / "run")
    assert_user_error(result, file, "compressed")
    assert result.max_rss_mb is not None and result.max_rss_mb < RSS_MB, result.max_rss_mb


def test_one_storage_referenced_thousands_of_times_is_bounded(tmp_path):
    """4,000 tensors over one 256 KiB storage: each reference re-read the member and copied the tensor (1 GiB from
    a 300 KB file); now a storage is read once and the references are counted against the file's size."""
    obj, storages = verl_batch()
    storages["9"] = np.arange(1 << 16, dtype=np.float32).tobytes()
    pid = storage("9", 1 << 16)
    obj["extra"] = [tensor(pid, 0, (1 << 16,), (1,)) for _ in range(4000)]
    file = _write(tmp_path, obj, storages)
    result = _import(file, tmp_path / "run")
    assert_user_error(result, file, "again and again")
    assert result.max_rss_mb is not None and result.max_rss_mb < RSS_MB, result.max_rss_mb
