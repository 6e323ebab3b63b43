"""Build real framework dumps for the importer tests, the way each framework writes them (torch/pandas/pickle)."""
from __future__ import annotations

import json
import pickle
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch


@dataclass
class Truth:
    """What the source holds per sample: the importer must reproduce it exactly."""

    prompt: list[int]
    response: list[int]
    rollout: np.ndarray  # float32, one per response token
    train: np.ndarray  # float32
    mask: np.ndarray  # int, 0 on tool tokens
    index: int = 0
    reward: float = 0.0
    extra: dict = field(default_factory=dict)


def make_truth(seed: int = 0, n: int = 7, max_len: int = 12) -> list[Truth]:
    """Random samples with a tool span (mask 0, rollout placeholder 0.0) and an empty response."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = 0 if i == 2 else int(rng.integers(1, max_len + 1))
        rollout = (-rng.exponential(1.0, length)).astype(np.float32)
        train = (rollout + rng.normal(0, 0.05, length)).astype(np.float32)
        mask = np.ones(length, dtype=np.int64)
        if length >= 6:
            mask[2:4] = 0
            rollout[2:4] = 0.0  # the placeholder frameworks store on tool tokens
        out.append(Truth(prompt=rng.integers(1, 1000, int(rng.integers(2, 9))).tolist(),
                         response=rng.integers(1, 1000, length).tolist(), rollout=rollout, train=train, mask=mask,
                         index=100 + i, reward=float(rng.integers(0, 2))))
    return out


def slime_sample(t: Truth, group: int) -> dict:
    """Sample.to_dict() of slime's dataclass (status and nested infos already converted to plain values)."""
    return {
        "group_index": group, "index": t.index, "prompt": f"prompt {t.index}", "tokens": t.prompt + t.response,
        "multimodal_inputs": None, "multimodal_train_inputs": None, "response": f"response {t.index}",
        "response_length": len(t.response), "label": "42", "reward": t.reward, "loss_mask": t.mask.tolist(),
        "weight_versions": ["1"], "rollout_log_probs": t.rollout.tolist(), "rollout_routed_experts": None,
        "remove_sample": False, "teacher_log_probs": None, "status": "completed", "metadata": {},
        "generate_function_path": None, "train_metadata": None, "session_id": None, "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                      "completion_token_num": len(t.response)},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": len(t.prompt)},
    }


def save_slime_rollout(path: Path, truth: list[Truth], rollout_id: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": [slime_sample(t, i // 2) for i, t in enumerate(truth)]}, path)
    return path


def save_slime_train(path: Path, truth: list[Truth], rollout_id: int = 3, rank: int = 0) -> Path:
    """A train dump as slime's save_debug_train_data writes it: columns of per-sample tensors."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rollout_data = {
        "tokens": [torch.tensor(t.prompt + t.response) for t in truth],
        "response_lengths": [len(t.response) for t in truth],
        "loss_masks": [torch.tensor(t.mask, dtype=torch.int) for t in truth],
        "rollout_log_probs": [torch.tensor(t.rollout) for t in truth],
        "log_probs": [torch.tensor(t.train) for t in truth],
        "sample_indices": [t.index for t in truth],
        "rewards": [t.reward for t in truth],
    }
    torch.save({"rollout_id": rollout_id, "rank": rank, "rollout_data": rollout_data}, path)
    return path


VERL_PROTOCOL = textwrap.dedent('''
    """Stand-in for verl.protocol: DataProto pickled with pickle.dump, as DataProto.save_to_disk does."""
    import pickle
    from dataclasses import dataclass, field

    @dataclass
    class DataProto:
        batch: object = None
        non_tensor_batch: dict = field(default_factory=dict)
        meta_info: dict = field(default_factory=dict)

        def save_to_disk(self, filepath):
            with open(filepath, "wb") as f:
                pickle.dump(self, f)
''')

TENSORDICT = textwrap.dedent('''
    """Stand-in for tensordict._td.TensorDict: tensors in `_tensordict`, pickled through __dict__."""
    class TensorDict:
        def __init__(self, source, batch_size):
            self._tensordict = dict(source)
            self._batch_size = batch_size
''')


def verl_tensors(truth: list[Truth], resp_len: int = 14, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """The gen batch tensors: prompts left-padded, responses right-padded, rollout_log_probs padded with 0.0."""
    b = len(truth)
    p_len = max(len(t.prompt) for t in truth)
    prompts = torch.full((b, p_len), pad_id, dtype=torch.long)
    responses = torch.full((b, resp_len), pad_id, dtype=torch.long)
    rollout = torch.zeros((b, resp_len), dtype=torch.float32)
    old = torch.zeros((b, resp_len), dtype=torch.float32)
    response_mask = torch.zeros((b, resp_len), dtype=torch.long)
    attention = torch.zeros((b, p_len + resp_len), dtype=torch.long)
    for i, t in enumerate(truth):
        n = len(t.response)
        prompts[i, p_len - len(t.prompt):] = torch.tensor(t.prompt)
        responses[i, :n] = torch.tensor(t.response, dtype=torch.long)
        rollout[i, :n] = torch.from_numpy(t.rollout)
        old[i, :n] = torch.from_numpy(t.train)
        response_mask[i, :n] = torch.from_numpy(t.mask)
        attention[i, p_len - len(t.prompt):p_len + n] = 1
    return {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attention, "response_mask": response_mask, "rollout_log_probs": rollout,
            "old_log_probs": old}


def save_verl(path: Path, truth: list[Truth], pkg_root: Path, *, tensordict: bool = False,
              drop: tuple[str, ...] = (), step: int | None = None, non_tensor: dict | None = None) -> Path:
    """Write gen_batch.dp with a stand-in verl DataProto, then make verl un-importable again."""
    for mod, source in (("verl/protocol.py", VERL_PROTOCOL), ("tensordict/_td.py", TENSORDICT)):
        file = pkg_root / mod
        file.parent.mkdir(parents=True, exist_ok=True)
        (file.parent / "__init__.py").touch()
        file.write_text(source)
    sys.path.insert(0, str(pkg_root))
    try:
        from tensordict._td import TensorDict
        from verl.protocol import DataProto

        tensors = {k: v for k, v in verl_tensors(truth).items() if k not in drop}
        batch = TensorDict(tensors, batch_size=[len(truth)]) if tensordict else tensors
        uids = np.array([f"uid-{i // 2}" for i in range(len(truth))], dtype=object)
        proto = DataProto(batch=batch, non_tensor_batch={"uid": uids, **(non_tensor or {})},
                          meta_info={"temperature": 1.0})
        path.parent.mkdir(parents=True, exist_ok=True)
        proto.save_to_disk(path)
        if step is not None:
            (path.parent / "meta.json").write_text(json.dumps({"global_steps": step}))
    finally:
        sys.path.remove(str(pkg_root))
        for name in [m for m in sys.modules if m.split(".")[0] in {"verl", "tensordict"}]:
            del sys.modules[name]
    return path


def pickle_dump(path: Path, obj: object) -> Path:
    with open(path, "wb") as handle:
        pickle.dump(obj, handle)
    return path


def assert_run_matches(run, truth: list[Truth], *, train: bool = True, rollout: bool = True, mask: bool = True,
                       prompts: bool = True) -> None:
    """The imported run equals the source token for token: ids, both logprobs, masks, lengths, prompts."""
    tokens, sequences = run.tokens(), run.sequences()
    assert len(sequences) == len(truth)
    assert sequences["response_len"].tolist() == [len(t.response) for t in truth]
    assert len(tokens) == sum(len(t.response) for t in truth)
    for seq_id, t in enumerate(truth):
        rows = tokens[tokens.seq_id == seq_id]
        assert rows["pos"].tolist() == list(range(len(t.response)))
        assert rows["token_id"].tolist() == t.response, f"seq {seq_id}: token ids differ"
        if rollout:
            np.testing.assert_array_equal(rows["rollout_logprob"].to_numpy(np.float32), t.rollout,
                                          err_msg=f"seq {seq_id}: rollout logprobs differ")
        else:
            assert rows["rollout_logprob"].isna().all()
        if train:
            np.testing.assert_array_equal(rows["train_logprob"].to_numpy(np.float32), t.train,
                                          err_msg=f"seq {seq_id}: train logprobs differ")
        else:
            assert rows["train_logprob"].isna().all()
        expected_mask = (t.mask != 0) if mask else np.ones(len(t.response), bool)
        assert rows["mask"].tolist() == expected_mask.tolist(), f"seq {seq_id}: mask differs"
        if prompts:
            assert list(sequences.loc[seq_id, "prompt_token_ids"]) == t.prompt
            assert sequences.loc[seq_id, "prompt_len"] == len(t.prompt)


CORPUS = ["the answer is 42", "what is six times seven", "compute the sum of two and three", "it is five",
          "user assistant system", "hello world"] * 20
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def train_tokenizer(path: Path) -> Path:
    """A small byte-level BPE tokenizer trained here and saved like a model's tokenizer directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = __import__("tokenizers").decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return path


SLIME_TYPES = textwrap.dedent('''
    """Stand-in for slime.utils.types (the fields of Sample that matter here, its Status enum)."""
    from dataclasses import dataclass, field
    from enum import Enum

    @dataclass
    class Sample:
        group_index: int | None = None
        index: int | None = None
        prompt: str = ""
        tokens: list = field(default_factory=list)
        response: str = ""
        response_length: int = 0
        reward: float | None = None
        loss_mask: list | None = None
        rollout_log_probs: list | None = None

        class Status(Enum):
            PENDING = "pending"
            COMPLETED = "completed"
            TRUNCATED = "truncated"

        status: Status = Status.PENDING
''')


def save_slime_objects(path: Path, truth: list[Truth], pkg_root: Path) -> Path:
    """An older-style rollout dump holding Sample objects (not dicts); slime is made un-importable afterwards."""
    file = pkg_root / "slime/utils/types.py"
    file.parent.mkdir(parents=True, exist_ok=True)
    for init in (pkg_root / "slime/__init__.py", pkg_root / "slime/utils/__init__.py"):
        init.touch()
    file.write_text(SLIME_TYPES)
    sys.path.insert(0, str(pkg_root))
    try:
        from slime.utils.types import Sample

        samples = [Sample(group_index=i // 2, index=t.index, prompt="p", tokens=t.prompt + t.response,
                          response="r", response_length=len(t.response), reward=t.reward,
                          loss_mask=t.mask.tolist(), rollout_log_probs=t.rollout.tolist(),
                          status=Sample.Status.TRUNCATED) for i, t in enumerate(truth)]
        torch.save({"rollout_id": 1, "samples": samples}, path)
    finally:
        sys.path.remove(str(pkg_root))
        for name in [m for m in sys.modules if m.split(".")[0] == "slime"]:
            del sys.modules[name]
    return path
