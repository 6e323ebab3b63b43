"""Import SGLang native `/generate` responses with MoE routes (`--enable-return-routed-experts`, requests with
`return_routed_experts: true`): one JSON object per line, as the server returns them.

A row is `{"text", "output_ids"?, "input_ids"?, "meta_info": {"output_token_logprobs": [[logprob, token_id, text],
…], "prompt_tokens": P, "routed_experts": "<base64 int32>", "routed_experts_start_len"?: s, …}}`. The log-probs are
read as `rcdiag import jsonl` reads SGLang rows (rcdiag.importers.generic.sglang_record); the routes are a flat
int32 buffer of `[P + n − 1 − s, layers, top_k]` covering positions s … P+n−2 (rcdiag.importers.routes), whose
layers and top_k come from the model's config.json: pass `--tokenizer MODEL_DIR` (num_hidden_layers,
num_experts_per_tok; the layer count is SGLang's buffer's, every hidden layer).
"""
from __future__ import annotations

from pathlib import Path

from rcdiag.errors import InputError
from rcdiag.importers.common import Imported, ImportOptions, check_lengths, check_presence
from rcdiag.importers.generic import rows, sglang_record
from rcdiag.importers.routes import RouteCollector, decode_sglang, model_shape
from rcdiag.importers.values import token_id_list, whole_number

ROUTES_FIELD = "meta_info.routed_experts"
CONVENTIONS = {
    "row_shape": "SGLang native /generate responses",
    "rollout_logprobs": "SGLang meta_info.output_token_logprobs (after temperature/top-p, sglang#2664)",
    "placeholder": "none (one list per response)",
}


def read(path: Path, opts: ImportOptions, fmt: str = "sglang") -> Imported:
    """SGLang responses with routes into records (see the module docstring)."""
    shape = model_shape(opts.tokenizer)
    routes = RouteCollector()
    records = []
    for i, row in rows(path, "jsonl"):
        meta = row.get("meta_info")
        if not isinstance(meta, dict):
            raise InputError("not an SGLang /generate response (no meta_info object)", file=row["__file__"], row=i,
                             field="meta_info")
        record = sglang_record(row, i)
        if row.get("input_ids") is not None:
            record.prompt_ids = token_id_list(row["input_ids"], record.where, "input_ids")
        records.append(record)
        payload = meta.get("routed_experts")
        if payload is None:
            routes.add_none(len(record.response_ids))
            continue
        if shape is None:
            raise InputError("SGLang routes are a flat int32 buffer: the model's shape is needed to read them",
                             file=row["__file__"], row=i, field=ROUTES_FIELD,
                             hint="pass --tokenizer MODEL_DIR (its config.json gives num_hidden_layers and "
                                  "num_experts_per_tok)")
        prompt_len = whole_number(meta.get("prompt_tokens"), record.where, "meta_info.prompt_tokens")
        if prompt_len is None:
            prompt_len = None if record.prompt_ids is None else len(record.prompt_ids)
        if prompt_len is None:
            raise InputError("no prompt length: meta_info.prompt_tokens (or input_ids) places the routes",
                             file=row["__file__"], row=i, field="meta_info.prompt_tokens")
        start = whole_number(meta.get("routed_experts_start_len", 0), record.where,
                             "meta_info.routed_experts_start_len") or 0
        routes.experts = shape[2]
        routes.add(decode_sglang(payload, shape[0], shape[1], record.where, ROUTES_FIELD), prompt_len=prompt_len,
                   response_len=len(record.response_ids), where=record.where, field_name=ROUTES_FIELD, first=start)
    fields = {"rollout_logprobs": "meta_info.output_token_logprobs"}
    check_presence(records, fields)
    check_lengths(records, fields)
    lacks = ["trainer logprobs: not in the rows",
             "sampling settings (temperature, top-p/top-k): not in the rows", "train_entropy"]
    imported = Imported(fmt=fmt, path=path, records=records, conventions=dict(CONVENTIONS), lacks=lacks)
    routes.attach(imported, str(path))
    return imported
