"""Transformer Engine on the GPU host: the staging and build (te_env.sh), TE's spec against the fast spec in one
process, and the stop / resume on TE's spec."""

from __future__ import annotations

from resultsdoc.entries import Data
from resultsdoc.formatting import GB, gain, mem, n0, ratio

TE_ROWS = (("ours", "fast spec, recipe defaults"),
           ("megatron_te", "TE spec + fused RoPE, SwiGLU fusion and TE's cross-entropy (megatron_te at 3e7174c)"),
           ("megatron_te_graph", "the same + our whole-step CUDA graph (`kaiyuan.cuda_graph=true`)"),
           ("bridge_te", "TE spec, Megatron-Bridge's defaults (what `auto` trained at 3e7174c)"))


def te_caption(d: Data) -> str:
    b = d["batch"]["qwen3_1p7b"]
    steps = len(d["results"]["qwen3_1p7b"]["ours"]["losses"])
    return (f"qwen3_1p7b, seq {d['seq_length']}, micro batch {b['micro_batch']} × {b['micro_batches']}, random "
            f"tokens, {steps} steps, median of steps 4–{steps}; TE {d['te_version'].split()[0]}, no Apex; one process. "
            "Peak memory in GB.")


def te_rows(d: Data) -> list[list[str]]:
    q = d["results"]["qwen3_1p7b"]
    rows = [[label, n0(q[k]["tokens_per_s"]), f"{q[k]['tflops']:.0f}", mem(q[k]["peak_mem_gb"], GB)]
            for k, label in TE_ROWS]
    rows.append(["**fast spec ÷ TE spec with those three fusions**", f"**{ratio(q['ours_vs_megatron_te'])}**", "",
                 ""])
    return rows


def te_after(d: Data) -> str:
    q = d["results"]["qwen3_1p7b"]
    te, graph, bridge = (q[k]["tokens_per_s"] for k in ("megatron_te", "megatron_te_graph", "bridge_te"))
    return (f"The whole-step graph adds {gain(graph, te)} on top of TE; the three fusions add {gain(te, bridge)} over "
            "Bridge's defaults. The recipe now turns on two of them with TE's spec, fused RoPE and SwiGLU "
            "(Megatron-LM's defaults); TE's cross-entropy, which Megatron-LM rejects for stability, stays Megatron's "
            "native fused one, so the peer above runs one setting Megatron-LM would refuse. How the gain "
            "splits between the three, and the recipe's TE defaults as they are now, were not measured. The chunked "
            "loss was not tried on TE's spec. The gpt_smoke rows and the local spec's row are missing: the call's own "
            "time box ended during them (the file's notes).")


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
