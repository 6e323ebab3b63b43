"""Runs and an AppTest factory for the dashboard tests (synthetic runs from tests/fixtures/runs.py)."""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from rcdiag.store.run import Run
from tests.fixtures.runs import build_run

APP = Path(__file__).resolve().parents[2] / "app" / "dashboard.py"
VOCAB = 48


def write_tokenizer(directory: Path) -> Path:
    """A real `tokenizers` word-level tokenizer over the synthetic vocabulary (token i ↔ 'w{i}'), saved as
    tokenizer.json; the run's manifest points at this directory as its model path."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {f"w{i}": i for i in range(VOCAB)}
    vocab["<unk>"] = VOCAB
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="session")
def dash_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard_runs")


@pytest.fixture(scope="session")
def noisy_run(dash_root: Path) -> Run:
    """A run with a clear mismatch (mean |ℓ| ≈ 0.33, ~4 % of tokens with ratio > 2), several shards, and a
    manifest whose model path holds a tokenizer."""
    model = write_tokenizer(dash_root / "model")
    return build_run(dash_root / "noisy", "clean", noise=0.5, seed=3,
                     manifest={"models": {"engine": {"path": str(model)}, "trainer": {"path": str(model)}}})


@pytest.fixture(scope="session")
def clean_dash_run(dash_root: Path) -> Run:
    """A clean dense-like run (no tokenizer in the manifest: tokens show as ids)."""
    return build_run(dash_root / "clean", "clean", seed=5)


@pytest.fixture
def make_app(monkeypatch: pytest.MonkeyPatch) -> Callable[..., AppTest]:
    """AppTest of app/dashboard.py started as `rcdiag dashboard RUN...` would (the runs in sys.argv), run once."""
    def make(*runs: Run | Path, page: str | None = None) -> AppTest:
        monkeypatch.setattr(sys, "argv", [str(APP), *(str(getattr(r, "path", r)) for r in runs)])
        app = AppTest.from_file(str(APP), default_timeout=120)
        app.run()
        if page:
            app.switch_page(f"views/{page}.py").run()
        return app
    return make


def assert_clean(app: AppTest) -> None:
    """No exception element and no error message on the page."""
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]


PAYLOAD_HOST = "198.51.100.7"
"""TEST-NET-2 (RFC 5737): a host that never answers; the data strings below point at it."""
PAYLOADS = {"prompt_id": f"![x](http://{PAYLOAD_HOST}/pixel)",
            "finish_reason": f"[click](javascript:alert(1)) <img src=http://{PAYLOAD_HOST}/y> :material/home:"}


HEAVY_STEPS = 8


@pytest.fixture(scope="session")
def heavy_run(dash_root: Path) -> Run:
    """A heavy-tailed run (ℓ ~ Student t with 1.5 degrees of freedom: a few tokens at |ℓ| ≈ 5–7 among thousands
    near 0) over HEAVY_STEPS training steps whose tail grows with the step (Trends has a drift to show), ChatML
    prompts, and Markdown/HTML payloads in sequence 0's prompt_id and finish_reason (PAYLOADS)."""
    import numpy as np

    import rcdiag
    from tests.fixtures.runs import defect_frames, defect_manifest

    model = write_tokenizer(dash_root / "model")
    tokens, sequences = defect_frames("clean", seed=5, n_seq=200)
    sequences["step"] = sequences["seq_id"] * HEAVY_STEPS // len(sequences)
    step = tokens["seq_id"].map(sequences.set_index("seq_id")["step"]).to_numpy()
    # capped at 7 nats: MoE-like, so a correction is the advice (beyond 15 nats no numerics explains a token)
    noise = np.clip(np.random.default_rng(0).standard_t(1.5, len(tokens)) * 0.05 * (1 + 0.15 * step), -7, 7)
    shifted = tokens["rollout_logprob"] + noise
    tokens["train_logprob"] = np.where(shifted < 0, shifted, tokens["rollout_logprob"] - np.abs(noise))  # < 0
    sequences["prompt_text"] = [f"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is {i}+{i}?"
                                "<|im_end|>\n<|im_start|>assistant\n" for i in sequences["seq_id"]]
    for column, payload in PAYLOADS.items():
        sequences[column] = sequences[column].astype(object)
        sequences.loc[sequences["seq_id"] == 0, column] = payload
    manifest = {**defect_manifest("clean"), "models": {"engine": {"path": str(model)}, "trainer": {"path": str(model)}}}
    return rcdiag.write_run(dash_root / "heavy", tokens, sequences, manifest=manifest, shard_tokens=2000,
                            overwrite=True)
