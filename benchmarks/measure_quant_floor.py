"""Measure the noise floor a quantized engine adds, on the real sample model (SmolLM2-135M-Instruct), against bf16's.

rcdiag.analysis.metrics.precision gives each precision's noise scale σ (typical, largest plausible); bf16's is
measured (vLLM bf16 → transformers fp32), the quantized ones were estimates. This script measures them the way the
floor model reads a run: the float32 model samples responses to the shipped chat prompts, then the same tokens are
scored by copies of the model whose linear layers compute in bf16 with weights
- in bf16 (the reference the floor table was measured with),
- fake-quantized to fp8 e4m3 with one scale per output channel (vLLM's fp8 weight path: scaled e4m3, higher-precision
  accumulation),
- fake-quantized to int8 with one scale per output channel (W8A16),
- fake-quantized to 4 bits with one scale per group of 128 inputs (an AWQ/GPTQ-like grid),
and each copy's log-probs are judged against the float32 ones with rcdiag's own NoiseEvidence (σ̂, mean |ℓ|). The
ratio σ̂(quantized) / σ̂(bf16) is what the floor table's quantized rows should carry.

    python benchmarks/measure_quant_floor.py [--prompts 32] [--tokens 96] [--seed 0]

CPU only, ~2–4 min on 2 cores. Prints one row per precision and a JSON line. Weight-only fake quantization leaves
activation quantization (W8A8) out: its numbers are a lower bound for fp8/int8 W8A8 engines.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import ml_dtypes
import numpy as np
import torch

from rcdiag.analysis.metrics.floor import NoiseEvidence
from rcdiag.score.realmodel import REAL_PROMPTS, real_model_dir


def fake_fp8(weight: torch.Tensor) -> torch.Tensor:
    """e4m3 with one scale per output channel (max |w| → 448), dequantised back to float32."""
    w = weight.detach().float().cpu().numpy()
    scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-12) / 448.0
    q = (w / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale
    return torch.from_numpy(q)


def fake_int(weight: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """Symmetric round-to-nearest integers of `bits` bits, one scale per output channel (group None) or per group of
    `group` inputs, dequantised back to float32."""
    w = weight.detach().float()
    rows, cols = w.shape
    g = cols if group is None or cols % group else group
    blocks = w.reshape(rows, cols // g, g)
    top = 2 ** (bits - 1) - 1
    scale = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / top
    return (torch.round(blocks / scale).clamp(-top - 1, top) * scale).reshape(rows, cols)


VARIANTS = {"bfloat16": None, "fp8 weights": fake_fp8, "int8 weights": lambda w: fake_int(w, 8, None),
            "4-bit weights (g128)": lambda w: fake_int(w, 4, 128)}


def variant_model(base: torch.nn.Module, quantize) -> torch.nn.Module:
    """A bf16 copy of `base` whose Linear weights are `quantize`d first (None: bf16 only)."""
    import copy

    model = copy.deepcopy(base)
    if quantize is not None:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(quantize(module.weight))
    return model.to(torch.bfloat16)


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor, prompt_len: int) -> np.ndarray:
    """log p of the response tokens (float64 [n]) under `model`, logits in float32."""
    with torch.no_grad():
        logits = model(ids).logits.float()[:, prompt_len - 1:-1]
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, ids[:, prompt_len:, None])[..., 0].double().numpy().ravel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    path = real_model_dir()
    tok = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [json.loads(line) for line in REAL_PROMPTS.read_text().splitlines()[: args.prompts]]
    samples = []
    start = time.perf_counter()
    for row in prompts:
        text = tok.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            out = base.generate(ids, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.tokens,
                                min_new_tokens=args.tokens, pad_token_id=tok.eos_token_id)
        samples.append((out, ids.shape[1]))
    reference = np.concatenate([token_logprobs(base, ids, n) for ids, n in samples])
    print(f"sampled {len(samples)} responses, {reference.size} tokens in {time.perf_counter() - start:.0f} s")
    rows = {}
    for name, quantize in VARIANTS.items():
        model = variant_model(base, quantize)
        b = np.concatenate([token_logprobs(model, ids, n) for ids, n in samples])
        evidence = NoiseEvidence(temperature=False)
        evidence.update(reference, b, np.ones(b.size, bool))
        summary = evidence.finish()
        rows[name] = {"sigma": summary.sigma, "mean_abs": summary.mean_abs, "max_abs": summary.max_abs,
                      "tail_share": summary.tail_share}
        del model
    bf16 = rows["bfloat16"]["sigma"]
    print(f"{'precision':<22} {'σ̂':>8} {'×bf16':>7} {'mean |ℓ|':>9} {'max |ℓ|':>8}")
    for name, r in rows.items():
        print(f"{name:<22} {r['sigma']:8.4f} {r['sigma'] / bf16 if bf16 and math.isfinite(bf16) else math.nan:7.2f} "
              f"{r['mean_abs']:9.4f} {r['max_abs']:8.3f}")
    print(json.dumps({"tokens": int(reference.size), "rows": rows}))


if __name__ == "__main__":
    main()
