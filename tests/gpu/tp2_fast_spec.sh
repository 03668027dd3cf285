#!/usr/bin/env bash
# Megatron's tensor parallelism with the fast spec, on two CUDA GPUs with the package installed, from the
# repository root:
#   bash tests/gpu/tp2_fast_spec.sh
# gpt_smoke on the fast spec, same seed and data: TP=1 on one GPU, then TP=2 over two. (No sequence parallelism:
# without TE / Apex the spec's norms are torch's, which megatron-core refuses under it; validate() says so.)
# The CPU counterpart: tests/test_fast_spec_tp.py (TP=2 loss and gradients equal TP=1's).
# Both runs start from the same weights: megatron-core's CPU initialisation draws the full matrices from the seed
# and each TP rank keeps its slice (on the GPU each rank draws its own slice from its own RNG stream, so TP=2
# starts from another model). The report compares the two loss curves
# (they differ by TP's reduction order only) and the step times.
# Writes $out/tp1.log, tp2.log and tp2_fast_spec.json (benchmarks/determinism_report.py). Needs two GPUs.
set -euo pipefail
source tests/gpu/flags.sh
flag iters 40 "training iterations of each run"
parse_flags "$@"
source tests/gpu/env.sh
root=/tmp/tp2; rm -rf "$root"
common=(kaiyuan.run_root=$root kaiyuan.layer_spec=fast kaiyuan.data=sample train.train_iters=$opt_iters
        train.global_batch_size=8 train.micro_batch_size=2 logger.log_interval=1 scheduler.lr_warmup_iters=5
        checkpoint.save_interval=1000 model.use_cpu_initialization=true)
kaiyuan train gpt_smoke kaiyuan.run_name=tp1 "${common[@]}" > "$out/tp1.log" 2>&1
kaiyuan train gpt_smoke --nproc-per-node=2 kaiyuan.run_name=tp2 model.tensor_model_parallel_size=2 \
  "${common[@]}" > "$out/tp2.log" 2>&1
python3 benchmarks/determinism_report.py --pair tp1_vs_tp2 "$out/tp1.log" "$out/tp2.log" \
  --command "bash tests/gpu/tp2_fast_spec.sh" --out "$out/tp2_fast_spec.json" \
  --note "gpt_smoke, fast spec, same seed and data; TP=1 on one GPU vs TP=2 on two"
