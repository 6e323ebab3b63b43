"""Writer of verl's RolloutSkip dump in exactly the bytes verl writes, without verl installed.

What verl does (verl `verl/utils/rollout_skip.py` `RolloutSkip.dump`, `verl/protocol.py` `DataProto`):
`{dump_dir}/{experiment}_{project}/GBS{gbs}_N{n}_in{p}_out{r}/genstep_{gen_step:06d}/` gets `new_batch.dp` and
`gen_batch.dp` (each `DataProto.save_to_disk`: `pickle.dump(self, f)`), `meta.json` ({"global_steps", "gen_steps"})
and a line "train_step gen_step" appended to `../train_step__gen_step.txt`. `DataProto.__getstate__` returns
(torch.save bytes of `batch.contiguous().consolidate()` (a TensorDict), non_tensor_batch, meta_info), or with
VERL_DATAPROTO_SERIALIZATION_METHOD=numpy (batch_size, device, {key: (dtype name, shape, uint8 numpy bytes)}).
Here a module `verl.protocol` written to a temporary package root defines a DataProto with that __getstate__, so
the pickle names `verl.protocol.DataProto` exactly as verl's does; the batch is a real tensordict.TensorDict.
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np

from tests.importers.dumps import Truth, verl_tensors

PROTOCOL = textwrap.dedent('''
    """verl.protocol.DataProto's pickling (state = (batch bytes | numpy encoding, non_tensor_batch, meta_info))."""
    import io
    import os
    import pickle
    from dataclasses import dataclass, field

    import torch


    def _encode(batch):
        items = {}
        for key, value in batch.items():
            data = value.flatten().contiguous().view(torch.uint8).numpy()
            items[key] = (str(value.dtype).removeprefix("torch."), value.shape, data)
        return tuple(batch.batch_size), None, items


    @dataclass
    class DataProto:
        batch: object = None
        non_tensor_batch: dict = field(default_factory=dict)
        meta_info: dict = field(default_factory=dict)

        def __getstate__(self):
            batch = self.batch
            if batch is not None and hasattr(batch, "consolidate") and len(batch.keys()) > 0:
                batch = batch.contiguous().consolidate()
            if os.getenv("VERL_DATAPROTO_SERIALIZATION_METHOD") == "numpy":
                return (_encode(self.batch) if batch is not None else None), self.non_tensor_batch, self.meta_info
            buffer = io.BytesIO()
            torch.save(batch, buffer)
            return buffer.getvalue(), self.non_tensor_batch, self.meta_info

        def save_to_disk(self, filepath):
            with open(filepath, "wb") as f:
                pickle.dump(self, f)
''')


class _Batch(dict):
    """A dict of tensors with TensorDict's batch_size (for the numpy encoding without tensordict)."""

    batch_size: tuple = ()


def save_rollout_skip(dump_dir: Path, truth: list[Truth], pkg_root: Path, *, gen_step: int = 1,
                      train_step: int | None = None, numpy_method: bool = False, bf16_old: bool = False,
                      monkeypatch=None, current: bool = False) -> Path:
    """Write one RolloutSkip step directory; returns the gen_batch.dp path. `current`: verl @ 1dda039's
    SkipManager layout (verl/utils/skip/rollout_skip.py: `skip.rollout.enable=True` writes
    {dump_dir}/{exp}_{project}/GBS{n}_N{n}_in{p}_out{r}/{step}/gen_batch.dp + meta.json {"global_steps": step}) and
    what its gen batch holds: the rollout side only (old_log_probs are computed after the dump)."""
    module = pkg_root / "verl" / "protocol.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    (module.parent / "__init__.py").touch()
    module.write_text(PROTOCOL)
    train_step = gen_step if train_step is None else train_step
    step_dir = dump_dir / "exp_proj" / f"GBS{len(truth)}_N2_in16_out14" / (
        str(train_step) if current else f"genstep_{gen_step:06d}")
    step_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(pkg_root))
    try:
        import torch
        from verl.protocol import DataProto

        tensors = verl_tensors(truth)
        if current:
            tensors.pop("old_log_probs")
        if bf16_old:
            tensors["old_log_probs"] = tensors["old_log_probs"].to(torch.bfloat16)
        if numpy_method:
            monkeypatch.setenv("VERL_DATAPROTO_SERIALIZATION_METHOD", "numpy")
            batch = _Batch(tensors)
            batch.batch_size = (len(truth),)
            prompts = _Batch({"input_ids": tensors["prompts"]})
            prompts.batch_size = (len(truth),)
        else:
            from tensordict import TensorDict

            batch = TensorDict(tensors, batch_size=[len(truth)])
            prompts = TensorDict({"input_ids": tensors["prompts"]}, batch_size=[len(truth)])
        uids = np.array([f"uid-{i // 2}" for i in range(len(truth))], dtype=object)
        scores = np.array([float(i) / 10 for i in range(len(truth))], dtype=object)
        DataProto(batch=prompts, non_tensor_batch={"uid": uids}, meta_info={}).save_to_disk(
            step_dir / "new_batch.dp")
        DataProto(batch=batch, non_tensor_batch={"uid": uids, "score": scores},
                  meta_info={"temperature": 1.0}).save_to_disk(step_dir / "gen_batch.dp")
        (step_dir / "meta.json").write_text(json.dumps({"global_steps": train_step} if current else
                                                       {"global_steps": train_step, "gen_steps": gen_step}))
        with open(step_dir.parent / "train_step__gen_step.txt", "a") as handle:
            handle.write(f"{train_step} {gen_step}\n")
    finally:
        if numpy_method:
            monkeypatch.delenv("VERL_DATAPROTO_SERIALIZATION_METHOD")
        sys.path.remove(str(pkg_root))
        for name in [m for m in sys.modules if m.split(".")[0] == "verl"]:
            del sys.modules[name]
    return step_dir / "gen_batch.dp"
