"""Transformer Engine on the GPU host: the staging and build (te_env.sh), TE's spec against the fast spec in one
process, and the stop / resume on TE's spec."""

from __future__ import annotations

from resultsdoc.entries import Data
from resultsdoc.formatting import GB, gain, mem, n0, pct, ratio

TE_ROWS = (("ours", "fast spec, recipe defaults"),
           ("megatron_te", "TE spec + fused RoPE, SwiGLU fusion and TE's cross-entropy (megatron_te at 3e7174c)"),
           ("megatron_te_graph", "the same + our whole-step CUDA graph (`kaiyuan.cuda_graph=true`)"),
           ("bridge_te", "TE spec, Megatron-Bridge's defaults (what `auto` trained at 3e7174c)"))


def _caption(d: Data, lead: str, te_note: str, model: str = "qwen3_1p7b") -> str:
    b = d["batch"][model]
    steps = max(len(r["losses"]) for r in d["results"][model].values() if isinstance(r, dict) and "losses" in r)
    return (f"{lead}, rev {d['revision']}: {model}, seq {d['seq_length']}, micro batch {b['micro_batch']} × "
            f"{b['micro_batches']}, random tokens, {steps} steps, median of steps 4–{steps}; TE "
            f"{d['te_version'].split()[0]}{te_note}; one call, each row its own process. Peak memory in GB.")


def _row(r: dict, label: str) -> list[str]:
    note = f" ({r['incomplete']})" if "incomplete" in r else ""  # a row past its time limit says how far it got
    return [label + note, n0(r["tokens_per_s"]), f"{r['tflops']:.0f}", mem(r["peak_mem_gb"], GB)]


def te_caption(d: Data) -> str:
    return _caption(d, "The first run", ", no Apex")


def te_rows(d: Data) -> list[list[str]]:
    q = d["results"]["qwen3_1p7b"]
    rows = [_row(q[k], label) for k, label in TE_ROWS]
    rows.append(["**fast spec ÷ TE spec with those three fusions**", f"**{ratio(q['ours_vs_megatron_te'])}**", "",
                 ""])
    return rows


def te_after(d: Data) -> str:
    q = d["results"]["qwen3_1p7b"]
    te, graph, bridge = (q[k]["tokens_per_s"] for k in ("megatron_te", "megatron_te_graph", "bridge_te"))
    return (f"In that run the whole-step graph added {gain(graph, te)} on top of TE, and the three fusions "
            f"{gain(te, bridge)} over Bridge's defaults. One of the three, TE's cross-entropy, is a setting "
            "Megatron-LM refuses for stability; the recipe keeps Megatron's native fused one. The run "
            "above measures the recipe's TE defaults as they were until 4dc1ccc. The gpt_smoke rows and the local "
            "spec's row are missing here: the call's own time box ended during them (the file's notes).")


def recipe_te_caption(d: Data) -> str:
    return _caption(d, "The recipe's TE defaults against the fast spec", " importable for both rows")


def _same_as_recipe(d: Data) -> bool:
    return all(["recipe_te", "megatron_te"] in m["same_settings"] for m in d["row_settings"].values())


def recipe_te_rows(d: Data) -> list[list[str]]:
    q = d["results"]["qwen3_1p7b"]
    te_label = (f"TE spec, the recipe's defaults at {d['revision']} = Megatron-LM's: fused RoPE and SwiGLU, fused "
                "native cross-entropy" if _same_as_recipe(d) else "megatron_te")
    rows = [_row(q["ours"], "fast spec, recipe defaults"), _row(q["megatron_te"], te_label)]
    rows.append([f"**fast spec ÷ TE spec on the recipe's defaults at {d['revision']}**",
                 f"**{ratio(q['ours_vs_megatron_te'])}**", "", ""])
    return rows


def recipe_te_after(d: Data) -> str:
    q = d["results"]["qwen3_1p7b"]
    same = (f"At {d['revision']} `benchmarks/row_settings.py` found recipe_te (what `auto` trained where TE imports) "
            "and megatron_te building the same kernel settings on both models (until 4dc1ccc put the chunked loss "
            "on TE's spec), so one row stands for both; each row's "
            "`model_settings` is what its run recorded at train start. " if _same_as_recipe(d) else "")
    hf = q.get("hf_compile", {})
    hf_text = (f"transformers + torch.compile: {hf['error']} (no HF figure in this process). " if "error" in hf
               else "")
    missing = [m for m in d["row_settings"] if m not in d["results"]]
    return (f"{same}{hf_text}The first run's TE peer, which also had TE's cross-entropy, was ahead of the fast "
            "spec; this one, on Megatron's native cross-entropy, is behind. They are different calls at different "
            "revisions (3e7174c, b665a7c), so what the cross-entropy alone "
            "is worth was not isolated."
            + (f" Not run: {', '.join(missing)} (the session's device time)." if missing else ""))


ONE_CALL_ROWS = (("ours", "fast spec, recipe defaults, TE importable (as in an NGC container)"),
                 ("ours_without_te", "the same with TE hidden from its process (as on a TE-less host)"),
                 ("megatron_te", "TE spec, Megatron-LM's settings (the recipe's TE defaults before 4dc1ccc)"),
                 ("megatron_te_chunked_loss", "the same + our chunked loss (`kaiyuan.chunked_loss=true`)"),
                 ("megatron_local_without_te", "Megatron's local spec, TE hidden"))
ONE_CALL_RATIOS = (("ours", "megatron_te", "fast spec ÷ TE spec, both with TE importable"),
                   ("ours_without_te", "megatron_te", "fast spec with TE hidden ÷ TE spec"),
                   ("ours", "ours_without_te", "fast spec with TE importable ÷ with TE hidden"),
                   ("megatron_te_chunked_loss", "megatron_te", "TE spec + chunked loss ÷ TE spec"),
                   ("ours_without_te", "megatron_local_without_te", "fast spec ÷ local spec, TE hidden from both"))


def one_call_caption(d: Data) -> str:
    return _caption(d, "The fast spec, TE's spec and our chunked loss on it, in one call", "") + \
        " TE hidden: the row's process has TE's folders off its path."


def one_call_rows(d: Data) -> list[list[str]]:
    return _one_call_table(d["results"]["qwen3_1p7b"], ONE_CALL_ROWS, ONE_CALL_RATIOS)


def _one_call_table(q: dict, labels: tuple, ratios: tuple) -> list[list[str]]:
    """The rows a call measured, then each ratio of two of them (bold)."""
    rows = [_row(q[k], label) for k, label in labels if "tokens_per_s" in q.get(k, {})]
    for a, b, label in ratios:
        if "tokens_per_s" in q.get(a, {}) and "tokens_per_s" in q.get(b, {}):
            # merge_results would refuse a ratio with a row past its time limit; here it is stated with how far each got
            why = "; ".join(f"{k} {q[k]['incomplete']}" for k in (a, b) if "incomplete" in q[k])
            rows.append([f"**{label}**" + (f" ({why}; timed steps {q[a]['timed_steps']} and {q[b]['timed_steps']})"
                                          if why else ""),
                         f"**{ratio(q[a]['tokens_per_s'] / q[b]['tokens_per_s'])}**", "", ""])
    return rows


def one_call_after(d: Data) -> str:
    q = d["results"]["qwen3_1p7b"]
    both = [{**q[k]["model_settings"], **q[k]["model_settings"]["fast_path"]} for k in ("ours", "ours_without_te")]
    differ = sorted(p for p in both[0] if p != "fast_path" and both[0][p] != both[1].get(p))
    te, chunked = q["megatron_te"], q["megatron_te_chunked_loss"]
    return (f"The chunked loss on TE's spec saves {te['peak_mem_gb'] - chunked['peak_mem_gb']:.1f} GB of peak "
            "memory here. With TE importable the fast spec is slower than with TE hidden; of the "
            "kernel settings the two runs recorded, "
            + (f"only {', '.join(f'`{p}`' for p in differ)} differs, which was not isolated as the cause."
               if differ else "none differs."))


GPT_SMOKE_ROWS = (("ours", "fast spec, recipe defaults, TE importable (as in an NGC container)"),
                  ("megatron_te", "TE spec, Megatron-LM's settings (the recipe's TE defaults before 4dc1ccc)"),
                  ("megatron_te_chunked_loss", "the same + our chunked loss (`kaiyuan.chunked_loss=true`)"),
                  ("megatron_te_graph", "the same + our whole-step CUDA graph (`kaiyuan.cuda_graph=true`)"),
                  ("hf_compile", "transformers + torch.compile (SDPA, fused AdamW)"))
GPT_SMOKE_RATIOS = (("ours", "megatron_te", "fast spec ÷ TE spec, both with TE importable"),
                    ("megatron_te_chunked_loss", "megatron_te", "TE spec + chunked loss ÷ TE spec"),
                    ("megatron_te_graph", "megatron_te", "TE spec + whole-step graph ÷ TE spec"),
                    ("ours", "hf_compile", "fast spec ÷ transformers + torch.compile"))


def gpt_smoke_caption(d: Data) -> str:
    return _caption(d, "gpt_smoke: the fast spec, TE's spec with each of our pieces, and transformers + "
                    "torch.compile, in one call", " importable for every row", model="gpt_smoke")


def gpt_smoke_rows(d: Data) -> list[list[str]]:
    return _one_call_table(d["results"]["gpt_smoke"], GPT_SMOKE_ROWS, GPT_SMOKE_RATIOS)


def gpt_smoke_after(d: Data) -> str:
    q = d["results"]["gpt_smoke"]
    te, chunked = q["megatron_te"], q["megatron_te_chunked_loss"]
    drift = max(abs(a - b) for a, b in zip(te["losses"], chunked["losses"]))
    return (f"The chunked loss on TE's spec halves its peak memory here ({mem(te['peak_mem_gb'], GB)} → "
            f"{mem(chunked['peak_mem_gb'], GB)}): gpt_smoke's logits (151,936 columns, the padded vocabulary) are a "
            f"large share of a small model's step. Its {len(chunked['losses'])} losses are within {drift:.3f} of the "
            "TE row's. At that revision the recipe's `auto` left it off on TE's spec; from 4dc1ccc on `auto` puts it "
            "there (the qwen3_1p7b table with transformers + torch.compile above).")


QWEN3_HF_ROWS = (("ours", "fast spec, recipe defaults, TE importable (as in an NGC container)"),
                 ("megatron_te", "TE spec, Megatron-LM's settings: fused RoPE, SwiGLU, native cross-entropy, whole "
                                 "logits"),
                 ("recipe_te", "TE spec on the recipe's defaults, what `auto` trains where TE imports: the same + "
                               "our chunked loss"),
                 ("hf_compile", "transformers + torch.compile (SDPA, fused AdamW)"))
QWEN3_HF_RATIOS = (("ours", "megatron_te", "fast spec ÷ TE spec (Megatron-LM's settings)"),
                   ("recipe_te", "megatron_te", "the recipe's TE defaults ÷ Megatron-LM's, on TE's spec"),
                   ("ours", "hf_compile", "fast spec ÷ transformers + torch.compile"),
                   ("hf_compile", "megatron_te", "transformers + torch.compile ÷ TE spec (Megatron-LM's settings)"))


def qwen3_hf_caption(d: Data) -> str:
    return _caption(d, "qwen3_1p7b: the fast spec, TE's spec as Megatron-LM sets it and as the recipe does, and "
                    "transformers + torch.compile, in one call", f" importable for every row, on an {d['host']['gpu']} "
                    "(the other TE tables are the H200's: compare their ratios, not their tokens/s)")


def qwen3_hf_rows(d: Data) -> list[list[str]]:
    return _one_call_table(d["results"]["qwen3_1p7b"], QWEN3_HF_ROWS, QWEN3_HF_RATIOS)


def _loss_split(a: list[float], b: list[float]) -> tuple[int, float]:
    """The step (0-based) where two loss curves differ most, and how far apart they are at every other step."""
    diffs = [abs(x - y) for x, y in zip(a, b)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    return worst, max(x for i, x in enumerate(diffs) if i != worst)


def qwen3_hf_after(d: Data) -> str:
    q = d["results"]["qwen3_1p7b"]
    te, recipe = q["megatron_te"], q["recipe_te"]
    worst, rest = _loss_split(te["losses"], recipe["losses"])
    return (f"The chunked loss, on through `auto` on TE's spec from this revision, saves "
            f"{te['peak_mem_gb'] - recipe['peak_mem_gb']:.1f} GB of peak memory here; its losses are within "
            f"{rest:.4f} of the whole-logits row's except at step {worst + 1} ({te['losses'][worst]:.3f} against "
            f"{recipe['losses'][worst]:.3f}; the fast spec's is {q['ours']['losses'][worst]:.3f}: bf16 runs of "
            "different kernels part at that step in every TE call so far, not traced).")


def te_graph_qwen3(d: Data) -> str:
    q = d["results"]["qwen3_1p7b"]
    te, graph = q["megatron_te"], q["megatron_te_graph"]
    worst, rest = _loss_split(te["losses"], graph["losses"])
    return (f"Our whole-step CUDA graph on TE's spec, qwen3_1p7b (rev {d['revision']}, one call, TE importable, "
            f"{te['timed_steps']} and {graph['timed_steps']} timed steps): {n0(te['tokens_per_s'])} → "
            f"{n0(graph['tokens_per_s'])} tokens/s ({gain(graph['tokens_per_s'], te['tokens_per_s'])}), peak "
            f"{mem(te['peak_mem_gb'], GB)} → {mem(graph['peak_mem_gb'], GB)}. Losses: within {rest:.4f} of each other "
            f"except at step {worst + 1}, {te['losses'][worst]:.3f} against {graph['losses'][worst]:.3f} "
            "(bf16 runs of different kernels part; one run, not traced further).")


def te_env(d: Data) -> str:
    s = d["summary"]
    return (f"`tests/gpu/te_env.sh` ({d['set']}): {s['calls_to_ready']} back-to-back calls from a cold machine "
            f"to `import transformer_engine.pytorch` (TE {d['te_version']}), {s['first_part_to_ready_s']['lease 1']} s "
            f"from the first part to ready; the extension's build took {s['extension_build_s_on_16_cores']}. "
            f"On the defaults, `auto` picks TE's spec; doctor shows the workarounds for TE-less hosts not applied and "
            "the new one for a TE host without Apex applied. gpt_smoke trained on it, 40 steps of the bundled "
            f"corpus: {d['te_proof']['train_gpt_smoke_defaults (call 14)'].split(': ', 1)[1]}.")


def te_stop_resume(d: Data) -> str:
    stop = d["stop"]
    return (f"Stop / resume on TE's spec (gpt_smoke): stopped at {d['stop_requested_at_iteration']}, checkpoint "
            f"{stop['last_checkpoint']} saved, resumed at {d['resumed_at_iteration']} and finished; the losses after "
            f"it differ from the uninterrupted run's by at most {d['max_abs_loss_diff_after_resume']:.3f}, less than "
            f"two uninterrupted same-seed runs differ ({d['control_max_abs_loss_diff']:.3f}): TE's training is not "
            "deterministic here, so this does not show an exact resume.")


def te_stop_resume_deterministic(d: Data) -> str:
    verdict = ("identical to the uninterrupted run's (max |difference| "
               f"{d['max_abs_loss_diff_after_resume']:.1g})" if d["identical_after_resume"]
               else f"off by at most {d['max_abs_loss_diff_after_resume']:.3g}")
    control = "identical" if d["control_identical"] else f"off by {d['control_max_abs_loss_diff']:.3g}"
    return (f"With `kaiyuan.deterministic=true` on TE's spec (rev {d['revision']}): stopped at "
            f"{d['stop_requested_at_iteration']}, checkpoint {d['stop']['last_checkpoint']} saved, resumed at "
            f"{d['resumed_at_iteration']}; the {len(d['compared_iterations'])} losses after it are {verdict}, and the "
            f"control's are {control}: **stop / resume on TE is exact**, as on the local spec.")


def te_export_parity(d: Data) -> str:
    p, train = d["parity_detail"]["by_setting"], d["train"]
    fp32, bf16 = p["fp32_hf_eager"], p["bf16_hf_sdpa"]
    return (f"A TE checkpoint through export (rev {d['revision']}): gpt_smoke trained on TE's spec, "
            f"{train['last']['iteration']} steps of the bundled corpus (loss {train['first']['loss']:.2f} at "
            f"{train['first']['iteration']} → {train['last']['loss']:.2f}), exported to HF in "
            f"{d['export_seconds']:.1f} s. Megatron (TE) against transformers on {fp32['prompts']} prompts: in fp32 "
            f"max |logit difference| {fp32['max_abs_logit_diff']:.3g}, greedy agreement "
            f"{pct(fp32['greedy_agreement_all_positions'])} at every position; in bf16 (HF's SDPA) "
            f"{bf16['max_abs_logit_diff']:.3g}, agreement {pct(bf16['greedy_agreement_all_positions'])} at every "
            f"position and {pct(bf16['greedy_next_token_agreement'])} for the next token. Both gaps are wider than the "
            "local spec's export (Export, serve, eval). TE computes every fp32 GEMM in TF32 (cuBLASLt's fast-TF32 "
            "compute type, no switch), which would explain the fp32 gap; " + _tf32_scale(p))


def _tf32_scale(p: dict) -> str:
    """What the file shows of TF32's share of the fp32 gap: files from export_parity.py after 51a800e measure it."""
    if "hf_fp32_vs_hf_tf32" not in p:
        return ("that it does, and where the bf16 gap comes from (TE's kernels against transformers' in bf16), were "
                "not separated by runs of their own.")
    gap, own = p["fp32_hf_eager"]["max_abs_logit_diff"], p["hf_fp32_vs_hf_tf32"]["max_abs_logit_diff"]
    verdict = (f"**TE's fp32 gap is the size of TF32's own rounding** ({gap / own:.2f}× what TF32 alone does to "
               "transformers' logits)" if gap <= 1.5 * own
               else f"TE's fp32 gap is {gap / own:.1f}× TF32's own shift, so TF32 alone does not account for it")
    return (f"transformers' own fp32 logits move by up to {own:.3g} when its matmuls run in TF32 "
            f"(`hf_fp32_vs_hf_tf32`), and TE against transformers with TF32 on both sides differs by "
            f"{p['fp32_tf32_hf_eager']['max_abs_logit_diff']:.3g}: {verdict}.")
