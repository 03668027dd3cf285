#!/usr/bin/env bash
# GPU check for [perf] §2 numerics, through the device tool from the repo root (wheels in .whl):
#   bash tests/gpu/fast_vs_local.sh
# gpt_smoke, 200 steps on the bundled sample corpus, same seed, on the local spec and on the fast spec; the
# loss logged every 10 steps (Megatron's average over the interval) must agree within 1 % after warmup.
set -euo pipefail
source tests/gpu/env.sh
root=/tmp/fast_vs_local; rm -rf "$root"
for spec in local fast; do
  kaiyuan train gpt_smoke kaiyuan.run_root=$root kaiyuan.run_name=$spec kaiyuan.layer_spec=$spec \
    train.train_iters=200 logger.log_interval=10 checkpoint.save_interval=1000 > "$out/$spec.log" 2>&1
done
python3 benchmarks/determinism_report.py --pair local_vs_fast "$out/local.log" "$out/fast.log" --after 20 \
  --command "bash tests/gpu/fast_vs_local.sh" --out "$out/fast_vs_local.json" \
  --note "gpt_smoke 200 steps, sample corpus, seed 1234, log interval 10; local spec (a) vs fast spec (b) after warmup"
