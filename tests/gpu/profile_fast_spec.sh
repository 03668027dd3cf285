#!/usr/bin/env bash
# Where qwen3_1p7b's step goes on the fast spec, on one CUDA GPU with the package installed, from the repository root:
#   bash tests/gpu/profile_fast_spec.sh            (--extra "kaiyuan.sdpa_backend=cudnn ..." for a variant;
#                                                  --model gpt_smoke --micro-batch 4 for the small model)
# Mock data, seq 4096, micro batch 2 x 4 (the throughput benchmark's batch); a PyTorch profiler trace of
# iteration 7 on rank 0; the run prints the trace's top kernels, the time per kernel family and how busy
# the GPU was. The summary and the gzipped trace (when under 16 MiB) land in --out.
set -euo pipefail
source tests/gpu/flags.sh
flag model qwen3_1p7b "the recipe"
flag micro-batch 2 "train.micro_batch_size (4 micro-batches a step)"
flag extra "" "more overrides, space-separated, e.g. \"kaiyuan.sdpa_backend=cudnn validation.eval_iters=0\""
parse_flags "$@"
source tests/gpu/env.sh
root=/tmp/profile; rm -rf "$root"
model=$opt_model; mbs=$opt_micro_batch
# shellcheck disable=SC2086  # --extra is a list of overrides
kaiyuan train "$model" kaiyuan.run_root=$root kaiyuan.layer_spec=fast kaiyuan.data=mock \
  train.train_iters=8 train.micro_batch_size=$mbs train.global_batch_size=$((mbs * 4)) dataset.seq_length=4096 \
  logger.log_interval=1 checkpoint.save=null profile.enabled=true 'profile.steps=[7,7]' $opt_extra \
  > "$out/profile_train.log" 2>&1 || { tail -30 "$out/profile_train.log"; exit 1; }
ls -la "$root/$model"/torch_profile
# the trace when it is small enough to keep beside the results (16 MiB); the summary in any case
find "$root/$model"/torch_profile -name 'rank-*.json.gz' -size -16M -exec cp {} "$out/" \;
cp "$root/$model"/torch_profile/summary-*.txt "$out/"  # written by the run (ProfileSummaryCallback)
cat "$out"/summary-*.txt
