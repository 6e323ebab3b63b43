"""Silent wrong results and tracebacks on bad input, each now a clear error: fractional token ids, a verl meta.json
that is not a JSON object, `--out .`, a string under `messages`, a symlink loop typed into the dashboard, a taken
--port. Each test failed before its fix (truncated to 5, a traceback, or accepted)."""
from __future__ import annotations

import json
import socket

import pytest

from app import ui
from rcdiag.cli import main
from rcdiag.commands.dashboard import HOST, check_port
from rcdiag.errors import ConfigError, InputError
from rcdiag.importers import ImportOptions, import_run
from rcdiag.score.prompts import load_prompts
from tests.importers.dumps import make_truth, save_verl


@pytest.mark.parametrize("ids", [[1, 5.5, 3], [1, None, 3]])
def test_fractional_or_missing_token_id_is_refused(tmp_path, ids):
    file = tmp_path / "r.jsonl"
    file.write_text(json.dumps({"response_ids": [7, 8]}) + "\n" + json.dumps({"response_ids": ids}) + "\n")
    with pytest.raises(InputError, match=r"row 2 field 'response_ids': token id .* \(item 2 of the list\) is not a "
                                         "whole number"):
        import_run("jsonl", file, tmp_path / "run", ImportOptions(quiet=True, ids_only=True))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("meta", "message"), [("{not json", "meta.json: not valid JSON"),
                                               ("[7]", "meta.json: expected a JSON object, got list")])
def test_verl_meta_json_that_is_not_an_object(tmp_path, meta, message):
    save_verl(tmp_path / "d/7/gen_batch.dp", make_truth(seed=3, n=2), tmp_path / "pkgs", step=7)
    (tmp_path / "d/7/meta.json").write_text(meta)
    with pytest.raises(InputError, match=message):
        import_run("verl", tmp_path / "d", tmp_path / "run", ImportOptions(allow_pickle=True, quiet=True))


def test_import_out_dot_is_a_clear_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "r.jsonl").write_text(json.dumps({"response_ids": [1, 2], "logprobs": [-1.0, -2.0]}) + "\n")
    monkeypatch.chdir(tmp_path)
    assert main(["import", "jsonl", "r.jsonl", "--out", ".", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: --out '.': is the current directory") and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_messages_holding_a_string_is_not_a_plain_prompt(tmp_path):
    file = tmp_path / "p.jsonl"
    file.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n"
                    + json.dumps({"messages": "What is 2+2?"}) + "\n")
    with pytest.raises(InputError, match="row 2 field 'messages': holds a string, but a chat is a list"):
        load_prompts(file)


def test_prompt_rows_of_a_parquet_file_count_from_1(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", ""]}), tmp_path / "p.parquet")
    with pytest.raises(InputError, match="row 2 field 'prompt': empty prompt text"):
        load_prompts(tmp_path / "p.parquet")


def test_symlink_loop_typed_into_the_dashboard_is_refused(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert ui.allowed(tmp_path / "loop" / "run", [], cwd=tmp_path) is False


def test_dashboard_port_in_use_is_refused_before_the_url(clean_run, capsys):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--port {port}: cannot listen on"):
            check_port(port)
        assert main(["dashboard", str(clean_run.path), "--port", str(port)]) == 1
    captured = capsys.readouterr()
    assert "http://" not in captured.out and f"--port {port}: cannot listen" in captured.err
