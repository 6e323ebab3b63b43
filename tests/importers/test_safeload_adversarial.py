"""safeload against hostile files: TorchScript archives, size bombs and classic pickle payloads are refused with a
clear InputError (never a traceback, never torch's own advice), while real torch.save / pickle dumps load exactly.

`--allow-pickle` is consent to read tensors out of a pickle, not to run code: nothing in these files may execute or
make rcdiag allocate memory sized by a number written in the file.
"""
from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Tuple  # noqa: UP035 (TorchScript reads typing.Tuple)

import numpy as np
import pytest
import torch

from rcdiag.cli import main
from rcdiag.errors import InputError
from rcdiag.importers import ImportOptions, import_run
from rcdiag.importers.safeload import load_pickle_file
from tests.importers.dumps import assert_run_matches, make_truth, pickle_dump, save_slime_rollout, save_verl

OK = ImportOptions(allow_pickle=True, quiet=True)


class Payload(torch.nn.Module):
    """A scripted module whose `__setstate__` writes 16 bytes of 'O' into `target` when torch.jit.load runs it."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.n = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, bool]:  # noqa: UP006 (TorchScript wants typing.Tuple)
        return (self.target, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, bool]) -> None:  # noqa: UP006
        self.target = state[0]
        self.training = state[1]
        t = torch.from_file(self.target, True, 16, dtype=torch.uint8)
        t.fill_(79)
        self.n = int(t.sum())


def torchscript_archive(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(Payload(str(target))), str(path))
    assert not target.exists()
    return path


@pytest.fixture(scope="module")
def payload_is_live(tmp_path_factory) -> None:
    """Control: torch.jit.load of the same kind of archive really runs the payload (so the refusals below mean it)."""
    root = tmp_path_factory.mktemp("control")
    archive = torchscript_archive(root / "control.pt", root / "hit")
    torch.jit.load(str(archive))
    assert (root / "hit").read_bytes() == b"O" * 16


def _assert_torchscript_refused(message: str, file: Path) -> None:
    assert str(file) in message
    assert "TorchScript" in message and "refuse" in message
    assert "weights_only" not in message


def test_torchscript_slime_dump_is_refused_and_runs_nothing(tmp_path, payload_is_live):
    target = tmp_path / "target"
    file = torchscript_archive(tmp_path / "dump.pt", target)
    with pytest.raises(InputError) as info:
        import_run("slime", file, tmp_path / "run", OK)
    _assert_torchscript_refused(str(info.value), file)
    assert info.value.file == str(file)
    assert not target.exists()
    assert not (tmp_path / "run").exists()


def test_torchscript_refused_when_target_already_exists(tmp_path, payload_is_live):
    """An existing file is not overwritten (the issue's report: the payload created and overwrote a file)."""
    target = tmp_path / "target"
    file = torchscript_archive(tmp_path / "dump.pt", target)
    target.write_bytes(b"\0" * 16)
    with pytest.raises(InputError, match="TorchScript"):
        load_pickle_file(file)
    assert target.read_bytes() == b"\0" * 16


def test_torchscript_through_the_cli(tmp_path, capsys, payload_is_live):
    target = tmp_path / "target"
    file = torchscript_archive(tmp_path / "dump.pt", target)
    out = tmp_path / "x"
    assert main(["import", "slime", str(file), "--out", str(out), "--allow-pickle", "-q"]) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("Error: ") and "Traceback" not in err + captured.out
    _assert_torchscript_refused(err, file)
    assert not target.exists() and not out.exists()


def test_torchscript_as_verl_gen_batch(tmp_path, capsys, payload_is_live):
    """A `<step>/gen_batch.dp` that is really a TorchScript archive, found by the verl importer's directory walk."""
    target = tmp_path / "target"
    file = torchscript_archive(tmp_path / "cache/7/gen_batch.dp", target)
    with pytest.raises(InputError) as info:
        import_run("verl", tmp_path / "cache", tmp_path / "run", OK)
    _assert_torchscript_refused(str(info.value), file)
    assert main(["import", "verl", str(tmp_path / "cache"), "--out", str(tmp_path / "x"), "--allow-pickle",
                 "-q"]) == 1
    _assert_torchscript_refused(capsys.readouterr().err, file)
    assert not target.exists()


def test_torchscript_bytes_inside_a_pickle_are_refused(tmp_path, payload_is_live):
    """A plain pickle whose 'storage' is a TorchScript archive handed to torch.storage._load_from_bytes."""
    target = tmp_path / "target"
    archive = torchscript_archive(tmp_path / "inner.pt", target)

    class Inner:
        def __reduce__(self):
            return (torch.storage._load_from_bytes, (archive.read_bytes(),))

    file = pickle_dump(tmp_path / "gen_batch.dp", {"responses": Inner()})
    with pytest.raises(InputError) as info:
        import_run("verl", file, tmp_path / "run", OK)
    _assert_torchscript_refused(str(info.value), file)
    assert not target.exists()


# --- size bombs: no allow-listed callable may allocate memory sized by a number from the file ---------------------

class Reduce:
    """Pickles as `func(*args)` (plus an optional BUILD state), whatever func is."""

    def __init__(self, func: Any, args: tuple, state: Any = None) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


def _reconstruct() -> Any:
    return np._core.multiarray._reconstruct if hasattr(np, "_core") else np.core.multiarray._reconstruct


# A size that a regression would really allocate is kept small (SMALL, 2**20…): the refusal must not depend on the
# size, and a regressed test must not take the machine's memory; the 2**40+ sizes fail fast in malloc instead.
SMALL = 10 ** 6
BOMBS = {
    "bytearray_2_62": Reduce(bytearray, (2 ** 62,)),
    "bytearray_that_fits": Reduce(bytearray, (2 ** 24,)),
    "bytes_count": Reduce(bytes, (2 ** 40,)),
    "list_of_range": Reduce(list, (range(SMALL),)),
    "tuple_of_range": Reduce(tuple, (range(SMALL),)),
    "set_of_range": Reduce(set, (range(SMALL),)),
    "bytearray_of_range": Reduce(bytearray, (range(256),)),
    "ordered_dict_of_range": Reduce(OrderedDict, (range(SMALL),)),
    "ndarray_call": Reduce(np.ndarray, ((2 ** 40,), np.dtype(object))),
    "reconstruct_shape": Reduce(_reconstruct(), (np.ndarray, (2 ** 40,), b"O")),
    "object_array_state": Reduce(_reconstruct(), (np.ndarray, (0,), b"b"),
                                 (1, (10 ** 12,), np.dtype(object), False, [1])),
    "object_array_state_that_fits": Reduce(_reconstruct(), (np.ndarray, (0,), b"b"),
                                           (1, (2 ** 20,), np.dtype(object), False, [1])),
    "subarray_dtype_state": Reduce(_reconstruct(), (np.ndarray, (0,), b"b"),
                                   (1, (1,), np.dtype((object, (2 ** 20,))), False, [1])),
    "float_storage_call": Reduce(torch.FloatStorage, (2 ** 40,)),
    "torch_size_of_range": Reduce(torch.Size, (range(SMALL),)),
}


@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_size_bombs_are_refused(tmp_path, name, protocol):
    file = tmp_path / f"{name}.pkl"
    try:
        file.write_bytes(pickle.dumps({"samples": [BOMBS[name]]}, protocol=protocol))
    except (pickle.PicklingError, TypeError) as exc:  # e.g. a dtype protocol 2 cannot write
        pytest.skip(f"cannot write this pickle: {exc}")
    with pytest.raises(InputError) as info:
        load_pickle_file(file)
    message = str(info.value)
    assert info.value.file == str(file)
    assert "MemoryError" not in message and "weights_only" not in message


def _zip_with(tmp_path: Path, obj: Any, storages: dict[str, bytes], pid: Any) -> Path:
    """A torch.save-shaped zip whose data.pkl holds `obj`, with persistent id `pid(marker)` for the marker object."""

    class Pickler(pickle.Pickler):
        def persistent_id(self, o):
            return pid if o is MARKER else None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
    file = tmp_path / "bomb.pt"
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("bomb/data.pkl", buf.getvalue())
        zf.writestr("bomb/byteorder", "little")
        for key, data in storages.items():
            zf.writestr(f"bomb/data/{key}", data)
        zf.writestr("bomb/version", "3\n")
    return file


class _Marker:
    pass


MARKER = _Marker()


@pytest.mark.parametrize(("numel", "size"), [(2 ** 40, (2 ** 40,)), (4, (2 ** 40,)), (4, (5,)), (2 ** 62, (1,))])
def test_storage_size_beyond_the_member_is_refused(tmp_path, numel, size):
    """The storage's element count, and the tensor's extent, are checked against the bytes really in the file."""
    tensor = Reduce(torch._utils._rebuild_tensor_v2, (MARKER, 0, size, (1,) * len(size), False, OrderedDict()))
    file = _zip_with(tmp_path, {"samples": [tensor]}, {"0": b"\0" * 16},
                     ("storage", torch.FloatStorage, "0", "cpu", numel))
    with pytest.raises(InputError) as info:
        load_pickle_file(file)
    assert info.value.file == str(file) and "weights_only" not in str(info.value)


def test_compressed_member_is_refused(tmp_path):
    """torch.save stores members uncompressed; a deflated member could inflate far beyond the file's size."""
    file = tmp_path / "deflated.pt"
    torch.save({"a": torch.zeros(1000)}, tmp_path / "src.pt")
    with zipfile.ZipFile(tmp_path / "src.pt") as src, zipfile.ZipFile(file, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    with pytest.raises(InputError, match="compressed"):
        load_pickle_file(file)


# --- classic pickle payloads: still refused, through both the zip and the plain-pickle path ------------------------

PAYLOADS = {
    "os_system": (__import__("os").system, ("touch {target}",)),
    "eval": (eval, ("__import__('os').system('touch {target}')",)),
    "exec": (exec, ("open('{target}', 'w').close()",)),
    "subprocess": (__import__("subprocess").Popen, (["touch", "{target}"],)),
    "torch_load": (torch.load, ("{target}",)),
    "jit_load": (torch.jit.load, ("{target}",)),
}


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_classic_payloads_are_refused(tmp_path, name, how):
    func, args = PAYLOADS[name]
    target = tmp_path / "pwned"
    evil = Reduce(func, tuple(a.format(target=target) if isinstance(a, str) else
                              [x.format(target=target) for x in a] for a in args))
    file = tmp_path / "evil.pt"
    if how == "torch.save":
        torch.save({"samples": [evil]}, file)
    else:
        pickle_dump(file, {"samples": [evil]})
    with pytest.raises(InputError, match="references") as info:
        load_pickle_file(file)
    assert info.value.file == str(file)
    assert not target.exists()


@pytest.mark.parametrize(("owner", "attr"), [("builtins\nstr", "format"), ("builtins\ndict", "fromkeys"),
                                           ("builtins\ndict", "__class__"), ("builtins\nbytearray", "fromhex"),
                                           ("verl.protocol\nDataProto", "__init__"),
                                           ("torch._utils\n_rebuild_tensor_v2", "__globals__")])
def test_getattr_chains_are_refused(tmp_path, owner, attr):
    """getattr resolves only the stand-ins' nested classes (Sample.Status): never a method, dunder or global."""
    file = tmp_path / "walk.pkl"
    file.write_bytes(f"cbuiltins\ngetattr\n(c{owner}\nV{attr}\ntR.".encode())
    with pytest.raises(InputError, match="references|asks for attribute") as info:
        load_pickle_file(file)
    assert info.value.file == str(file)


# --- real dumps still load exactly -------------------------------------------------------------------------------

def _tensors(numpy: bool, v3: bool) -> dict[str, Any]:
    """Every dtype a dump may hold, views sharing a storage, offsets, non-contiguous strides, empties, 0-d; numpy
    arrays only where asked (protocol 2, torch.save's, writes their bytes through `_codecs.encode`, not loaded);
    uint16/float8 (`_rebuild_tensor_v3`) only in the zip format (torch cannot read them back from the legacy one)."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=gen)
    out: dict[str, Any] = {
        "f32": torch.randn(7, generator=gen), "f64": torch.randn(3, 2, dtype=torch.float64, generator=gen),
        "f16": torch.randn(5, generator=gen).half(), "bf16": torch.randn(9, generator=gen).bfloat16(),
        "i64": torch.arange(-5, 5), "i32": torch.arange(4, dtype=torch.int32),
        "i16": torch.arange(4, dtype=torch.int16), "i8": torch.arange(-3, 3, dtype=torch.int8),
        "u8": torch.arange(250, 256, dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
        "c64": torch.randn(3, dtype=torch.complex64, generator=gen),
        "base": base, "transposed": base.t(), "sliced": base[2:5, 1::2], "row": base[3],
        "empty": torch.empty(0, 3), "scalar": torch.tensor(2.5), "param": torch.nn.Parameter(torch.ones(2)),
        "nested": {"list": [torch.tensor([1, 2]), 3.5, "x", None], "tuple": (torch.zeros(2, dtype=torch.long),)},
    }
    if v3:
        out["u16"] = torch.tensor([1, 2, 65535]).to(torch.uint16)
        out["fp8"] = torch.randn(4, generator=gen).to(torch.float8_e4m3fn)
    if numpy:
        out["np"] = np.arange(6, dtype=np.float32).reshape(2, 3)
        out["np_obj"] = np.array(["a", None, 3, np.arange(2)], dtype=object)
    return out


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _assert_same(got: Any, want: Any, where: str = "") -> None:
    if isinstance(want, torch.Tensor):
        assert type(got) is type(want), where
        assert (got.dtype, got.shape, got.stride(), got.storage_offset()) == \
            (want.dtype, want.shape, want.stride(), want.storage_offset()), where
        assert _bytes(got) == _bytes(want), where
    elif isinstance(want, np.ndarray):
        assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape, where
        for i, (g, w) in enumerate(zip(got.reshape(-1), want.reshape(-1), strict=True)):
            _assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, where


@pytest.mark.parametrize("how", ["zip", "legacy", "pickle"])
def test_real_dumps_load_bit_identically(tmp_path, how):
    """torch.save (zip and legacy) and pickle.dump (storages as legacy bytes) give back what torch.load gives."""
    want = _tensors(numpy=how == "pickle", v3=how == "zip")
    file = tmp_path / "dump.pt"
    if how == "zip":
        torch.save(want, file)
    elif how == "legacy":
        torch.save(want, file, _use_new_zipfile_serialization=False)
    else:
        pickle_dump(file, want)
    reference = pickle.loads(file.read_bytes()) if how == "pickle" else torch.load(file, weights_only=False)
    _assert_same(reference, want)  # the trusted reading agrees with what was saved
    got = load_pickle_file(file)
    _assert_same(got, want)
    if how != "pickle":  # views of one storage still share memory, as torch.load gives them
        got["base"][0, 0] = 123.0
        assert got["transposed"][0, 0] == 123.0
        assert got["row"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()


def test_existing_slime_and_verl_fixtures_import_bit_identically(tmp_path):
    truth = make_truth(seed=60)
    file = save_slime_rollout(tmp_path / "r.pt", truth)
    run, _ = import_run("slime", file, tmp_path / "run1", OK)
    assert_run_matches(run, truth, train=False)
    file = save_verl(tmp_path / "gen_batch.dp", truth, tmp_path / "pkgs", tensordict=True)
    run, _ = import_run("verl", file, tmp_path / "run2", OK)
    assert_run_matches(run, truth)


# --- memory safety and memory bounds through the CLI (a crash must show as a crash: a subprocess) -------------------

def _slime_sample(tokens: Any, n: int = 4) -> dict[str, Any]:
    return {"tokens": tokens, "response_length": n, "rollout_log_probs": [-0.5] * n, "loss_mask": [1] * n,
            "reward": 0.0, "index": 0, "status": "completed"}


def _dtype(spec: str, state: tuple) -> Reduce:
    return Reduce(np.dtype, (spec, False, True), state)


def _array(dtype: Reduce, shape: tuple, data: bytes) -> Reduce:
    return Reduce(_reconstruct(), (np.ndarray, (0,), b"b"), (1, shape, dtype, False, data))


# numpy.dtype states a file may write: numpy's own __setstate__ takes the flags as given, so an object dtype whose
# flags say "no objects" gets raw bytes from the file that its first use reads as pointers
HOSTILE_DTYPES = {
    "object_flags_0": _dtype("O8", (3, "|", None, None, None, -1, -1, 0)),
    "object_field_flags_0": _dtype("V8", (3, "|", None, ("a",), {"a": (np.dtype(object), 0)}, 8, 1, 0)),
    "structured": _dtype("V8", (3, "|", None, ("a",), {"a": (np.dtype("<f8"), 0)}, 8, 1, 16)),
    "void": _dtype("V8", (3, "|", None, None, None, 8, 1, 0)),
    "float_with_object_flags": _dtype("f8", (3, "<", None, None, None, -1, -1, 63)),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_DTYPES))
def test_hostile_numpy_dtypes_are_refused(tmp_path, name):
    """A 269-byte slime dump whose rollout_log_probs is an array of an object dtype with flags 0 crashed the
    interpreter (segfault) at its first numeric use: only plain dtypes exactly as numpy pickles them are read."""
    from tests.fixtures.cli import assert_user_error, run_cli

    file = tmp_path / "dump.pt"
    sample = _slime_sample([1, 2, 3, 4, 5, 6], n=2)
    sample["rollout_log_probs"] = _array(HOSTILE_DTYPES[name], (2,), b"\x41" * 16)
    file.write_bytes(pickle.dumps({"rollout_id": 0, "samples": [sample]}, protocol=4))
    result = run_cli(["import", "slime", str(file), "--out", str(tmp_path / "run"), "--allow-pickle", "-q"])
    assert_user_error(result, str(file), "dtype")
    assert not (tmp_path / "run").exists()


def test_plain_dtypes_and_object_arrays_still_load(tmp_path):
    """What numpy really writes still loads: every plain kind, text, and object arrays (verl's uid/score columns)."""
    want = {"f8": np.arange(3.0), "i4": np.arange(4, dtype=np.int32), "u1": np.arange(3, dtype=np.uint8),
            "b": np.array([True, False]), "c8": np.array([1 + 2j], np.complex64), "U": np.array(["ab", "c"]),
            "S": np.array([b"xy"]), "O": np.array(["uid-0", 0.5, None], dtype=object), "f2": np.ones(2, np.float16),
            "scalar": np.float32(1.5), "dtype": np.dtype("int16")}
    file = tmp_path / "plain.pkl"
    file.write_bytes(pickle.dumps(want, protocol=4))
    got = load_pickle_file(file)
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            assert type(got[key]) is np.ndarray and got[key].dtype == value.dtype, key
            assert got[key].tolist() == value.tolist(), key
        else:
            assert got[key] == value and type(got[key]) is type(value), key


RSS_MB = 400
"""Peak memory a refused import may reach (the interpreter with numpy, pyarrow and torch is ~155 MiB here)."""


def test_range_is_not_materialised(tmp_path):
    """A ~150-byte dump `{"tokens": range(10**8)}` made the importer allocate 800 MB (4e8: gigabytes): range is not
    on the allow-list, so nothing a file sizes with one number is ever built."""
    from tests.fixtures.cli import assert_user_error, run_cli

    file = tmp_path / "dump.pt"
    file.write_bytes(pickle.dumps({"rollout_id": 0, "samples": [_slime_sample(range(10 ** 8))]}, protocol=4))
    assert file.stat().st_size < 300
    result = run_cli(["import", "slime", str(file), "--out", str(tmp_path / "run"), "--allow-pickle", "-q"])
    assert_user_error(result, str(file), "range")
    assert result.max_rss_mb is not None and result.max_rss_mb < RSS_MB, result.max_rss_mb


def test_overlapping_zip_members_are_read_within_the_file_size(tmp_path):
    """300 stored members whose bytes overlap (each runs to the end of one 512 KiB payload): a 0.6 MB file made the
    reader allocate ~160 MB (a 1.4 MB file with 2,000 such members reached 16.8 GB). Every member read is charged
    to a budget of twice the file's size."""
    from tests.fixtures.cli import assert_user_error, run_cli
    from tests.importers.crafted import overlapping_zip, pickle_bytes, storage, tensor

    n, payload = 300, bytes(512 << 10)
    samples = [_slime_sample(tensor(storage(f"{i:04d}", len(payload) // 8, torch.LongStorage), 0,
                                    (len(payload) // 8,), (1,))) for i in range(n)]
    file = tmp_path / "dump.pt"
    file.write_bytes(overlapping_zip({"data.pkl": pickle_bytes({"rollout_id": 0, "samples": samples}),
                                      "byteorder": b"little"}, n, payload))
    assert file.stat().st_size < 1 << 20
    result = run_cli(["import", "slime", str(file), "--out", str(tmp_path / "run"), "--allow-pickle", "-q"])
    assert_user_error(result, str(file), "overlap")
    assert result.max_rss_mb is not None and result.max_rss_mb < RSS_MB, result.max_rss_mb


def test_one_sample_referenced_thousands_of_times_is_refused(tmp_path):
    """torch.save of one 5,000-token sample listed 2,000 times (a ~80 KB file): the importer made 2,000 copies, 10 M
    token rows. Counted once per reference, the dump stands for far more than its size and is refused."""
    from tests.fixtures.cli import assert_user_error, run_cli

    sample = _slime_sample(list(range(10, 5010)), n=4990)
    file = tmp_path / "dump.pt"
    torch.save({"rollout_id": 0, "samples": [sample] * 2000}, file)
    assert file.stat().st_size < 200_000
    result = run_cli(["import", "slime", str(file), "--out", str(tmp_path / "run"), "--allow-pickle", "-q"])
    assert_user_error(result, str(file), "again and again")
    assert result.max_rss_mb is not None and result.max_rss_mb < RSS_MB, result.max_rss_mb
