"""Export, serving and evaluation: logit parity, export time, generation, serving under load, held-out scores."""

from __future__ import annotations

from resultsdoc.entries import Data
from resultsdoc.formatting import n0, pct, sci


def export_parity(d: Data) -> str:
    lines = []
    for model, m in d["models"].items():
        sdpa = m["by_setting"]["bf16_hf_sdpa"]  # what users get (older files' headline was the better setting)
        lines.append(f"- {model} (rev {d['revision'][model]}, {sdpa['prompts']} prompts, {m['hf_class']}): fp32 "
                     f"{sci(m['max_abs_logit_diff_fp32'])}, bf16 {sdpa['max_abs_logit_diff']} (the default HF "
                     f"attention, SDPA; eager attention {m['by_setting']['bf16_hf_eager']['max_abs_logit_diff']}), "
                     f"greedy next token agreement {pct(sdpa['greedy_next_token_agreement'], 0)}; export on the GPU "
                     f"host {m['export_seconds_gpu_host_cli']} s.")
    return "\n".join(lines)


def export_time(d: Data) -> str:
    return (f"{d['recipe']} ({d['parameters'] / 1e9:.2f}B parameters, {d['hf_bytes'] / 1e9:.2f} GB of HF files) in "
            f"{d['export_s']:.1f} s (target {d['target_s']} s); writing its checkpoint took "
            f"{d['checkpoint_write_s']:.1f} s.")


def batch_header(d: Data) -> list[str]:
    """A generation table's header: one column per batch size in the file."""
    return ["", *(b.replace("_", " ") for b in d["results"])]


def generation_caption(d: Data) -> str:
    return (f"qwen3_1p7b with random weights, prompt {d['prompt_tokens']}, {d['new_tokens']} new tokens, "
            f"{'greedy' if d['greedy'] else 'sampled'}. Baseline: {d['baseline']}.")


def generation_rows(d: Data) -> list[list[str]]:
    r = d["results"]
    batches = list(r)
    return [["transformers `generate` (dynamic cache, eager)",
             *(f"{r[b]['hf_generate_tokens_per_s']:,.1f} tokens/s" if r[b]['hf_generate_tokens_per_s'] < 100
               else f"{n0(r[b]['hf_generate_tokens_per_s'])} tokens/s" for b in batches)],
            ["`kaiyuan serve` decoder (static cache, compiled step captured as one CUDA graph)",
             *(f"**{n0(r[b]['graph']['tokens_per_s'])} tokens/s ({r[b]['graph']['speedup_vs_hf_generate']:.1f}×)**"
               for b in batches)]]


def generation_after(d: Data) -> str:
    r, t, f = d["results"], d["targets_tokens_per_s"], d["fp32_agreement_with_hf_generate"]
    return (f"Targets {' and '.join(n0(v) for v in t.values())}. In fp32 the decoder's tokens equal `generate`'s on "
            f"{f['identical_rows']} of {f['rows']} rows; in bf16 on random weights they part after "
            f"~{r['batch_1']['graph']['mean_tokens_before_first_difference_bf16']:.0f} tokens (batch 1) at near-ties "
            f"of the flat logits. First call per batch size, compile and capture included: "
            f"{' and '.join(f'{r[b]["graph"]["first_call_s_incl_compile"]:.0f} s' for b in r)}. "
            "The transformers side is timed on its first call (issue 30, item 3).")


def generation_warm_caption(d: Data) -> str:
    cut = "" if d.get("complete") else (" Cut short by the session's device time after "
                                       f"{', '.join(b.replace('_', ' ') for b in d['results'])}: no larger batch, no "
                                       "fp32 check in this file.")
    fp32 = d.get("fp32_agreement_with_hf_generate")
    fp32 = "" if not fp32 else (f" In fp32 (no bf16 near-ties; a separate engine of {fp32['rows']} rows after the "
                                f"timed runs) the compiled decoder's greedy tokens equal `generate`'s in "
                                f"{fp32['identical_rows']} of {fp32['rows']} rows × {fp32['new_tokens']} tokens.")
    bf16 = [(b, r["compiled"]) for b, r in d["results"].items() if "identical_rows_bf16" in r.get("compiled", {})]
    fp32 += "".join(f" In bf16 at {b.replace('_', ' ')}, {pct(r['identical_rows_bf16'])} of rows are identical to "
                    f"`generate`'s, the first difference after {r['mean_tokens_before_first_difference_bf16']:.1f} "
                    "tokens on average (near-ties of random weights)." for b, r in bf16) if fp32 else ""
    return (f"Generation with every side warm (issue 30, item 3): {d['statistic']}; qwen3_1p7b with random weights, "
            f"prompt {d['prompt_tokens']}, {d['new_tokens']} new tokens, "
            f"{'greedy' if d['greedy'] else 'sampled'}, rev {d['revision']}.{cut}{fp32}")


WARM_SIDES = {"hf_generate": "transformers `generate` (dynamic cache, eager)",
              "hf_static_compiled": "transformers `generate` (static cache, its own torch.compile)",
              "compiled": "`kaiyuan serve` decoder, compiled mode (the default)",
              "graph": "`kaiyuan serve` decoder, graph mode"}


def generation_warm_rows(d: Data) -> list[list[str]]:
    r = d["results"]
    batches = list(r)
    sides = [s for s in WARM_SIDES if all(s in r[b] for b in batches)]

    def cell(b: str, side: str) -> str:
        row = r[b][side]
        ratios = ", ".join(f"{row[k]:.2f}× {k.removeprefix('speedup_vs_')}" for k in row if k.startswith("speedup_vs_"))
        return f"{n0(row['tokens_per_s'])} tokens/s" + (f" ({ratios})" if ratios else "")
    return [[WARM_SIDES[s], *(cell(b, s) for b in batches)] for s in sides]


def serve_load(d: Data, with_load: bool = True, same_run: bool = True) -> str:
    """The load and targets (with_load), then each side's figures; same_run: one serve_load.py run measured both
    sides, so their ratios are stated."""
    load, t = d["load"], d["targets"]
    parts = []
    for name in ("ours", "baseline"):
        if name not in d:
            continue
        side, w = d[name], d[name]["health"].get("warmup") or {}
        lat = side["load"]["latency_s"]
        # files from before /health reported the decode mode carry ours' at the top level
        mode = side["health"].get("envelope", {}).get("decode_mode") \
            or (d.get("decode_mode") if name == "ours" else None)
        batch_1 = side["batch_1"].get("decode_tokens_per_s")
        failed = side["load"]["requests_sent"] - side["load"]["completed"]
        rev = f"rev {side['revision']}, " if side.get("revision") else ""
        parts.append(f"{name}{f' ({rev}{mode} decode)' if mode else ''}: "
                     f"{side['load']['errors']} errors, {side['load']['completed']} of {side['load']['requests_sent']} "
                     f"requests sent completed, p50 {lat['p50']:.2f} s, p95 {lat['p95']:.2f} s"
                     + (" (of the completed ones)" if failed else "") +
                     f", {n0(side['load']['tokens_per_s'])} new tokens/s, streamed first token p95 "
                     f"{side['load']['streamed_first_token_s']['p95']:.2f} s"
                     + (f", batch-1 decode {n0(batch_1)} tokens/s" if batch_1 else ", no batch-1 figure")
                     + (f", ready after {side['start_s']:.0f} s" if side.get("start_s") else "")
                     + (f" ({w['seconds']:.0f} s warm-up, {w['graphs']} graphs)" if w else "")
                     + (f", {side['gpu_memory_mib'] / 1024:.1f} GiB on the GPU" if side.get("gpu_memory_mib") else "")
                     + _time_split(side["load"].get("server") or side["load"].get("health_after")))
    r = d.get("ratios") or {}
    ratios = "" if not (same_run and r.get("tokens_per_s_ours_over_baseline")
                        and r.get("p95_latency_baseline_over_ours")) else (
        f" Ours ÷ baseline in the same run: {r['tokens_per_s_ours_over_baseline']:.2f}× tokens/s, p95 "
        f"{r['p95_latency_baseline_over_ours']:.2f}× shorter.")
    sides = "; ".join(parts) + "." + ratios + (f" Scope: {d['scope']}." if d.get("scope") else "")
    if not with_load:
        return sides
    return (f"Serving under load (`benchmarks/serve_load.py`): {load['clients']} clients × "
            f"{load['requests_per_client']} requests, prompts of {load['prompt_tokens']} tokens, "
            f"{load['new_tokens']} new tokens, {load['mix']}; targets: {t['errors']} errors, p95 ≤ "
            f"{t['p95_latency_s_at_most']} s, ≥ {n0(t['tokens_per_s_at_least'])} tokens/s, batch 1 ≥ "
            f"{t['batch_1_tokens_per_s_at_least']} tokens/s. " + sides)


def _time_split(health: Data | None) -> str:
    """Where the server's time went over the (first) pass, from its own counters: `server`, the pass's deltas;
    `health_after`, /health after a one-pass load (the files of 2026-12-02)."""
    if not health or "decode_s" not in health:
        return ""
    return (f"; the server spent {health['decode_s']:.2f} s in {health['steps']} decode steps and "
            f"{health['prefill_s']:.2f} s in prefills")


def heldout(d: Data) -> str:
    r = d["results"]["qwen3_1p7b"]
    o = r["overall"]
    dims = [k for k in r if k != "overall"]
    return (f"{d['model']}, on {len(dims)} dimensions × {r[dims[0]]['samples']} samples: overall "
            f"{o['nll_per_token']:.2f} NLL/token, perplexity {n0(o['ppl'])}, {o['bits_per_byte']:.2f} bits per byte, "
            f"multiple-choice accuracy {o['mcq_acc_avg_norm']:.2f} — the pipeline, not the model.")
