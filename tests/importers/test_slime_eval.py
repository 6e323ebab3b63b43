"""slime `--dump-details` with an eval pass: `rollout_data/eval_{id}.pt` beside `{id}.pt`.

slime's RolloutManager._save_debug_rollout_data(evaluation=True) writes
`torch.save(dict(rollout_id=rollout_id, samples=[sample.to_dict() for every eval dataset's samples]), path)` with
the path template formatted with `"eval_" + str(rollout_id)` — the same dict as a training rollout dump (written
here by save_slime_rollout), with no train dump beside it."""
from __future__ import annotations

from rcdiag.importers import ImportOptions, import_run, read_dump
from tests.importers.dumps import assert_run_matches, make_truth, save_slime_rollout, save_slime_train

OK = ImportOptions(allow_pickle=True, quiet=True)


def _dump_details(root, train, evals):
    save_slime_rollout(root / "rollout_data/3.pt", train, rollout_id=3)
    save_slime_train(root / "train_data/3_0.pt", train, rollout_id=3)
    save_slime_rollout(root / "rollout_data/eval_3.pt", evals, rollout_id=3)
    save_slime_rollout(root / "rollout_data/eval_0.pt", evals[:2], rollout_id=0)


def test_eval_dumps_do_not_break_the_training_import(tmp_path):
    """The directory imports the training rollouts only (with their trainer log_probs), and says which eval dumps
    it skipped and how to import one."""
    train, evals = make_truth(seed=60, n=8), make_truth(seed=61, n=5)
    _dump_details(tmp_path / "dd", train, evals)
    run, imported = import_run("slime", tmp_path / "dd", tmp_path / "run", OK)
    assert_run_matches(run, train)
    skipped = [w for w in imported.warnings if "eval dump" in w]
    assert len(skipped) == 1 and "eval_0.pt, eval_3.pt" in skipped[0] and "import slime" in skipped[0]
    assert "population" not in run.manifest["source"]["conventions"]


def test_an_eval_dump_imports_as_its_own_run(tmp_path):
    """Given as the PATH, an eval dump is its own run: rollout side only, labelled as evaluation samples."""
    train, evals = make_truth(seed=62, n=6), make_truth(seed=63, n=5)
    _dump_details(tmp_path / "dd", train, evals)
    run, imported = import_run("slime", tmp_path / "dd/rollout_data/eval_3.pt", tmp_path / "eval_run", OK)
    assert_run_matches(run, evals, train=False)
    assert run.sequences()["step"].tolist() == [3] * 5
    assert imported.warnings == [] or not any("eval dump" in w for w in imported.warnings)


def test_directory_of_eval_dumps_only(tmp_path):
    """A directory holding only eval dumps imports them (nothing else to import) and says what they are."""
    evals = make_truth(seed=64, n=4)
    save_slime_rollout(tmp_path / "only/eval_1.pt", evals, rollout_id=1)
    imported = read_dump("slime", tmp_path / "only", OK)
    assert len(imported.records) == 4
    assert "evaluation samples" in imported.conventions["population"]
