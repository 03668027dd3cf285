"""What benchmarks/RESULTS.md says, in order: its sections and, in each, which result file each entry reads and
which topic function turns that file's JSON into rows or prose. The figures themselves are never written here."""

from __future__ import annotations

from resultsdoc.entries import Image, Section, Table, Text
from resultsdoc.topics.export_serve_eval import (
    batch_header,
    export_parity,
    export_time,
    generation_after,
    generation_caption,
    generation_rows,
    generation_warm_caption,
    generation_warm_rows,
    heldout,
    serve_load,
)
from resultsdoc.topics.fastpath_pieces import chunked_ab, graph_ab, host_loaded, norm_ab, profile_eager, step_fusion
from resultsdoc.topics.kernels import compiled_norm, decode_rows, kernels_rows, local_spec_compat
from resultsdoc.topics.moe import moe, moe_routing
from resultsdoc.topics.numerics import determinism, foreach_adam, max_rel_rows, onepass_after
from resultsdoc.topics.offline_tools import ckpt_memory_after, ckpt_memory_caption, ckpt_memory_rows, convert
from resultsdoc.topics.parallelism import tp2, zero_caption, zero_rows
from resultsdoc.topics.throughput import (
    fast_vs_local_one_run,
    profile_graph,
    throughput_caption,
    throughput_header,
    throughput_rows,
)
from resultsdoc.topics.training_runs import (
    journey,
    local_baseline,
    nemo2,
    nemo2_optimizer_probe,
    phase,
    stop_resume,
    train_proof,
)
from resultsdoc.topics.transformer_engine import (
    gpt_smoke_after,
    gpt_smoke_caption,
    gpt_smoke_rows,
    one_call_after,
    one_call_caption,
    one_call_rows,
    qwen3_hf_after,
    qwen3_hf_caption,
    qwen3_hf_rows,
    recipe_te_after,
    recipe_te_caption,
    recipe_te_rows,
    te_after,
    te_caption,
    te_env,
    te_export_parity,
    te_graph_qwen3,
    te_rows,
    te_stop_resume,
    te_stop_resume_deterministic,
)

INTRO = """The current figures, each from the result file under `benchmarks/results/` it names (with that file's
revision, host, date and command). Results that newer runs replaced are in
[`results/archive/`](results/archive/README.md). How each is produced:
[`tests/gpu/README.md`](../tests/gpu/README.md) and the scripts in this folder; which revision each GPU
proof last ran at is tabled there. The GPU host: 1 or 2 × H200 (an H100 where a file's host says so), bf16,
no Transformer Engine except in the section of that name. Peak memory carries its unit: GB (10⁹ bytes) in
files from rev 46ff3c1 on, GiB (2³⁰ bytes) before it (kaiyuan's metrics divided by 2³⁰ until then)."""

SECTIONS = [
    Section("The user journey", [
        Text("latest:*_journey_foreground.json", journey),
        Text("latest:*_journey.json", journey),
        Text("latest:*_journey_fw2606.json", journey),
        Text("latest:*_journey_te.json", journey),
    ]),
    Section("Training throughput", [
        Table("2026-12-01_train_throughput.json", throughput_caption, throughput_header(("qwen3_1p7b", "gpt_smoke")),
              throughput_rows),
        Image("results/2026-12-01_train_throughput.png", "training throughput"),
        Text("2026-12-03_te_throughput_qwen3.json", fast_vs_local_one_run),
        Text("2026-12-01_profile_qwen3_1p7b_graph.json",
             lambda d: "The default step's profile, qwen3_1p7b: " + profile_graph(d) + " The step is bound by its "
             "kernels."),
    ]),
    Section("Transformer Engine", [
        Text("2026-12-02_te_env.json", te_env),
        Table("2026-12-05_te_throughput_qwen3_hf.json", qwen3_hf_caption,
              ["qwen3_1p7b", "tokens/s/GPU", "model TFLOP/s", "peak memory"], qwen3_hf_rows, after=qwen3_hf_after),
        Image("results/2026-12-05_te_throughput_qwen3_hf.png", "qwen3_1p7b: the fast spec, TE's spec (Megatron-LM's "
              "settings and the recipe's), transformers + torch.compile"),
        Table("2026-12-03_te_throughput_qwen3.json", one_call_caption,
              ["qwen3_1p7b", "tokens/s/GPU", "model TFLOP/s", "peak memory"], one_call_rows, after=one_call_after),
        Image("results/2026-12-03_te_throughput_qwen3.png", "the fast spec, TE's spec and the chunked loss on TE"),
        Text("2026-12-04_te_graph_qwen3.json", te_graph_qwen3),
        Table("2026-12-04_te_throughput_gpt_smoke.json", gpt_smoke_caption,
              ["gpt_smoke", "tokens/s/GPU", "model TFLOP/s", "peak memory"], gpt_smoke_rows, after=gpt_smoke_after),
        Image("results/2026-12-04_te_throughput_gpt_smoke.png", "gpt_smoke: the fast spec, TE's spec with our pieces, "
              "transformers + torch.compile"),
        Table("2026-12-02_te_throughput_recipe_defaults.json", recipe_te_caption,
              ["qwen3_1p7b", "tokens/s/GPU", "model TFLOP/s", "peak memory"], recipe_te_rows, after=recipe_te_after),
        Image("results/2026-12-02_te_throughput_recipe_defaults.png", "the fast spec against TE's on the recipe"),
        Table("2026-12-02_te_throughput.json", te_caption,
              ["qwen3_1p7b", "tokens/s/GPU", "model TFLOP/s", "peak memory"], te_rows, after=te_after),
        Image("results/2026-12-02_te_throughput.png", "training throughput on TE's spec"),
        Text("2026-12-02_te_stop_resume_deterministic.json", te_stop_resume_deterministic),
        Image("results/2026-12-02_te_stop_resume_deterministic.png", "exact stop and resume on TE's spec"),
        Text("2026-12-02_te_stop_resume.json", te_stop_resume),
        Text("2026-12-05_te_proof.json", te_export_parity),
    ]),
    Section("What each fast-path piece adds", [
        Text(None, "Each an A/B inside one process (`benchmarks/train_throughput.py`); peak memory in GiB (files "
                   "before rev 46ff3c1):"),
        Text("2026-11-30_train_throughput_chunked_loss_ab.json", chunked_ab, bullet=True),
        Text("2026-11-30_train_throughput_compiled_norm_ab.json", norm_ab, bullet=True),
        Text("2026-11-30_train_throughput_cuda_graph_ab.json", graph_ab, bullet=True),
        Text("2026-11-30_train_throughput_step_fusion.json", step_fusion, bullet=True),
        Text("2026-11-30_train_throughput_host_loaded_graph_wgrad.json", host_loaded, bullet=True),
        Text("2026-11-30_profile_qwen3_1p7b_fast.json", profile_eager, bullet=True),
    ]),
    Section("Kernels on the GPU", [
        Text(None, "`tests/gpu/test_fast_spec_gpu.py` and `tests/gpu/test_decode_gpu.py` (host wall time per call "
                   "after a warm-up: for comparison within a line, not a benchmark)."),
        Table("2026-12-01_fast_spec_gpu_swiglu_rope.json", lambda d: d["result"] + ".",
              ["kernel", "ours", "reference"], kernels_rows),
        Table("2026-11-30_fast_spec_decode_gpu_rev3a37f28.json", lambda d: d["result"] + ".", ["kernel", "ms"],
              decode_rows),
        Text("2026-11-30_compiled_norm_gpu.json", compiled_norm),
        Text("2026-11-29_local_spec_compat_gpu.json", local_spec_compat),
    ]),
    Section("Numerics: fast spec vs local spec", [
        Text(None, "`tests/gpu/fast_vs_local.sh`: the fast spec's loss against the local spec's, same seed, at the "
                   "iterations Megatron logs after the warm-up; the largest relative difference. The noise floor is "
                   "the fast spec against itself with Megatron's fused cross-entropy (same function, other rounding)."),
        Table("2026-11-30_fast_vs_local_noise_floor.json", lambda d: f"The file's setting: {d['note']}.",
              ["pair", "max relative difference"],
              max_rel_rows((("local_vs_fast", "local vs fast"), ("noise_floor_fast_vs_fast_fused_ce", "noise floor")))),
        Table("2026-11-30_fast_vs_local_onepass.json", lambda d: f"The file's setting: {d['note'].split('. ')[0]}.",
              ["pair", "max relative difference"],
              max_rel_rows((("local_vs_fast_onepass", "local vs fast"),
                            ("noise_floor_fast_vs_fast_fused_ce_onepass", "noise floor"))), after=onepass_after),
        Text("2026-11-30_fast_vs_local_foreach_adam_onepass.json", foreach_adam),
        Image("results/2026-11-30_fast_vs_local_onepass.png", "fast vs local, one pass"),
    ]),
    Section("Determinism", [
        Text("2026-11-30_determinism_gpt_smoke.json", determinism),
    ]),
    Section("Stop and resume", [
        Text("2026-11-30_stop_resume.json", lambda d: "gpt_smoke on the local spec: " + stop_resume(d), bullet=True),
        Text("2026-11-30_stop_resume_cuda_graph.json",
             lambda d: "The local spec with the whole-step CUDA graph: " + stop_resume(d) + " The restarted run "
             "captured its graph again; both uninterrupted runs ran their final evaluation with the graph.",
             bullet=True),
        Image("results/2026-11-30_stop_resume.png", "stop and resume"),
    ]),
    Section("Curriculum phases", [
        Text("2026-11-30_phase_transition.json", phase),
        Image("results/2026-11-30_phase_transition.png", "phase transition"),
    ]),
    Section("Tensor parallelism", [
        Text("2026-11-30_tp2_fast_spec.json", tp2),
        Image("results/2026-11-30_tp2_fast_spec.png", "TP=1 vs TP=2"),
    ]),
    Section("ZeRO stages", [
        Text(None, "Eager step (neither the graph nor the weight-gradient fusion applies under Megatron-FSDP), fp32 "
                   "gradient accumulation at every stage (`benchmarks/zero_stages.py`); a row's figure is the median "
                   "of its steady steps (from the fourth on), and a row that timed out says how many it had."),
        Table("2026-11-30_zero_stages_all_stages_mb4.json", zero_caption,
              ["", "tokens/s/GPU", "of 1 GPU", "peak memory"], zero_rows),
        Table("2026-12-01_zero_stages_zero2_chunked_mb8x1.json", zero_caption,
              ["", "tokens/s/GPU", "of 1 GPU", "peak memory"], zero_rows,
              after="ZeRO 2 reduce-scatters the gradients after every micro-batch, where ZeRO 0/1 reduce once a step, "
                    "so fewer, larger micro-batches scale better. The ZeRO 2 losses with the chunked loss equal those "
                    "with full logits at every step to 3 decimals (the file's note)."),
        Image("results/2026-12-01_zero_stages_zero2_chunked_mb8x1.png", "ZeRO 2 at 8 × 1"),
        Image("results/2026-11-30_zero_stages_all_stages_mb4.png", "ZeRO stages"),
    ]),
    Section("Export, serving, evaluation", [
        Text("2026-11-30_export_parity.json",
             lambda d: "Logit parity, Megatron vs HF, max |Δlogit| over the vocabulary; in bf16 a logit of magnitude "
             "8–16 has a spacing of 0.0625, one bf16 ulp:\n\n" + export_parity(d)),
        Text("2026-11-30_export_time_cpu.json", lambda d: "Export time on the CPU host: " + export_time(d)),
        Table("2026-11-30_generation_graph_decoder.json", lambda d: "Generation: " + generation_caption(d),
              batch_header, generation_rows, after=generation_after),
        Table("2026-12-03_generation_warm_batch1.json", generation_warm_caption,
              batch_header, generation_warm_rows),
        Table("2026-12-04_generation_warm_batch32.json", generation_warm_caption,
              batch_header, generation_warm_rows),
        Text("latest:*_serve_load.json", serve_load),
        Image("results/2026-12-02_serve_load.png", "serving under load, ours and the baseline of the same run"),
        Text("2026-12-02_serve_load_vs_418de9a.json",
             lambda d: "Against the server issue 28 was filed at (418de9a), in one device call with rev 5e99546's "
             "but two runs of different settings (so no ratio here): "
             + serve_load(d, with_load=False, same_run=False)),
        Text("2026-12-01_serve_load_graph_ours_only.json",
             lambda d: "The same load in an earlier call, graph decode (the CUDA default before 77fbf8f): "
             + serve_load(d, with_load=False)),
        Text("2026-12-01_serve_warmup_compiled.json",
             lambda d: f"Start-up, `--decode-mode compiled` against `graph` ({d['envelope']['max_batch']} "
             f"rows × {d['envelope']['max_seq_len']} positions, qwen3_1p7b shape): {d['warmup_s']:.0f} s warm-up "
             f"({d['compile_and_first_bucket_s']:.0f} s compiling, {d['captures_s']:.0f} s for the rest of its "
             f"{d['graphs']} captures) against {d['baseline']['warmup_s']:.0f} s, "
             f"{d['ratio_warmup_compiled_vs_graph']:.0f}× longer, compiling {d['compiled']} (from 25dc7a0 it "
             "compiles one decoder layer for all: the load entry above has its warm-up)."),
        Text("2026-11-30_heldout_eval_qwen3_1p7b.json", lambda d: "Held-out evaluation: " + heldout(d)),
        Image("results/2026-11-30_heldout_eval_qwen3_1p7b.png", "held-out evaluation"),
    ]),
    Section("Checkpoint tools", [
        Table("2026-12-01_ckpt_memory.json", ckpt_memory_caption,
              ["", "peak RSS", "above the floor", "÷ size on disk", "÷ largest chunk", "wall"], ckpt_memory_rows,
              after=ckpt_memory_after),
    ]),
    Section("MoE", [
        Text("2026-11-30_moe.json", moe),
        Text("2026-11-30_moe_parity_routing.json", lambda d: "Routing: " + moe_routing(d)),
    ]),
    Section("Training on the local spec", [
        Text(None, "`tests/gpu/train_proof.sh` (the qwen3_1p7b file names the `kaiyuan train` commands the script "
                   "ran), mock data unless stated; peak memory in GiB (files before rev 46ff3c1):"),
        Text("2026-11-29_gpt_smoke_train.json",
             lambda d: train_proof("gpt_smoke, mock data: ")(d) + local_baseline(d), bullet=True),
        Text("2026-11-29_qwen3_1p7b_train.json", train_proof("qwen3_1p7b, mock data: "), bullet=True),
        Text("2026-11-29_gpt_smoke_sample_corpus_train.json",
             train_proof("gpt_smoke on the bundled sample corpus: "), bullet=True),
        Image("results/2026-11-29_train_curves.png", "training curves"),
    ]),
    Section("NeMo 2", [
        Text("2026-12-03_nemo2_gpu.json", nemo2),
        Text("2026-12-03_nemo2_optimizer_probe.json", nemo2_optimizer_probe),
        Image("results/2026-12-03_nemo2_gpu.png", "NeMo 2 vs kaiyuan train loss curves"),
    ]),
    Section("Data conversion", [
        Text("2026-11-29_convert_throughput.json", convert),
    ]),
]
