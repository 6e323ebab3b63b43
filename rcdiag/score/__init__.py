"""Stages 1 and 2 of `rcdiag score`: vLLM generation with processed log-probs, padding-free rescoring in
transformers. `config` is importable without torch or vLLM; everything else loads them on first use.
Never imports analysis or report."""
from rcdiag.lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("GenerateConfig", "RescoreConfig", "EngineSettings", "ENGINE_DTYPES", "TRAIN_DTYPES",
                     "ATTN_CHOICES", "canonical_dtype"), "rcdiag.score.config"),
    "generate_run": "rcdiag.score.generate",
    **dict.fromkeys(("score_run", "ScoreResult"), "rcdiag.score.run"),
    **dict.fromkeys(("rescore_run", "engine_model_path", "run_temperature"), "rcdiag.score.rescore"),
    "replay_run": "rcdiag.score.replay",
    **dict.fromkeys(("load_model", "score_sequences"), "rcdiag.score.scoring"),
    **dict.fromkeys(("pad_to_batch", "unpad_from_batch", "plan_rows"), "rcdiag.score.packing"),
    "reward": "rcdiag.score.sample",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
