"""The MoE proof: training, export, serving and the routing flips behind its bf16 logit differences."""

from __future__ import annotations

from resultsdoc.entries import Data
from resultsdoc.formatting import GIB, k1, mem, n0, pct, sci


def moe(d: Data) -> str:
    t, p, s = d["training"], d["parity"], d["serving"]
    prompts = p["by_setting"]["bf16_hf_sdpa"]["prompts"]
    ckpts = " / ".join(str(c) for launch in t.get("launches", []) for c in launch["checkpoints_saved"])
    trained = (d.get("layer_spec") or {}).get("trained")
    spec = f"the {trained} spec" if trained else "the fast spec requested; this file predates the record of the spec " \
        "that trained"
    return (f"{d['model']} scaled to one H200 (the script's batch and sequence settings; {spec}), "
            f"{t['steps']} steps at {k1(t['tokens_per_s_per_gpu'])} tokens/s, loss {t['first_loss']:.2f} → "
            f"{t['last_loss']:.2f}, {mem(t['peak_mem_gb'], GIB)}, checkpoints {ckpts}; `kaiyuan export hf` to "
            f"`{d['hf_class']}` in {d['export_seconds']} s; greedy next token equal on "
            f"{round(p['greedy_next_token_agreement_bf16'] * prompts)} of {prompts} prompts; `kaiyuan serve` "
            f"(`PUT /api` {'=' if s['put_api_equals_v1_completions'] else '≠'} `POST /v1/completions`) returns "
            f"{'the same' if s['served_tokens_equal_hf_generate'] else 'not the same'} {s['new_tokens']} tokens as HF "
            f"`generate`, whose KV cache {'equals' if s['hf_generate_kv_cache_equals_no_cache'] else 'differs from'} "
            f"no cache. Logits: fp32 max |Δ| {p['max_abs_logit_diff_fp32']:.3f}, bf16 "
            f"{p['max_abs_logit_diff_bf16']:.1f}.")


def moe_routing(d: Data) -> str:
    fp32, bf16 = d["by_setting"]["fp32_hf_eager"], d["by_setting"]["bf16_hf_sdpa"]
    rf, rb = fp32["routing"], bf16["routing"]
    return (f"the proof rerun at {d['training']['steps']} steps. An MoE routes each token to its top 8 of 64 "
            "experts, and a near-tie flips on rounding. In fp32 "
            f"{rf['decisions_differing']} of {n0(rf['token_layer_decisions'])} token-layer decisions differ and the "
            f"logits agree to {sci(fp32['max_abs_logit_diff'], 3)} (the conversion is exact); in bf16 "
            f"{pct(rb['decisions_differing'] / rb['token_layer_decisions'], 0)} differ, and before a prompt's first "
            f"flip the logits agree to {rb['max_abs_logit_diff_before_first_flip']} (bf16 max |Δ| "
            f"{bf16['max_abs_logit_diff']} after flips).")
