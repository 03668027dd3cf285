#!/usr/bin/env bash
# On one CUDA GPU with the package installed, when a resumed run is not bit-identical: which state differs after the
# first optimizer step of a resumed run. gpt_smoke, local spec, same seed: `resumed` exits at iteration
# 5 (train.exit_interval, checkpoint saved) and is started again; `reference` runs straight through.
# Both save at iteration 6; tests/gpu/ckpt_diff.py compares the two iteration-6 checkpoints tensor by
# tensor (model weights, fp32 main params, exp_avg, exp_avg_sq, optimizer param groups, scheduler).
#   bash tests/gpu/resume_diag.sh
set -euo pipefail
source tests/gpu/flags.sh
parse_flags "$@"
source tests/gpu/env.sh
root=/tmp/resume_diag; rm -rf "$root"
common=(kaiyuan.run_root=$root kaiyuan.layer_spec=local train.train_iters=7 train.global_batch_size=8
        train.micro_batch_size=2 logger.log_interval=1 scheduler.lr_warmup_iters=5 checkpoint.save_interval=3)
kaiyuan train gpt_smoke kaiyuan.run_name=reference "${common[@]}" > "$out/diag_reference.log" 2>&1 &
ref=$!
kaiyuan train gpt_smoke kaiyuan.run_name=resumed "${common[@]}" train.exit_interval=5 > "$out/diag_resumed_1.log" 2>&1
kaiyuan train gpt_smoke kaiyuan.run_name=resumed "${common[@]}" > "$out/diag_resumed_2.log" 2>&1
wait $ref
grep -h "lm loss" "$out"/diag_*.log | sed 's/.*iteration *\([0-9]*\).*lm loss: \([^ ]*\).*grad norm: \([^ ]*\).*/\1 \2 \3/' || true
python3 tests/gpu/ckpt_diff.py "$root/reference/checkpoints/iter_0000006" "$root/resumed/checkpoints/iter_0000006" \
  --out "$out/resume_diag_iter6.json"
