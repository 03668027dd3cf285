#!/usr/bin/env bash
# Train, stop at a checkpoint and restart, on one CUDA GPU with the package installed, from the repository root:
#   bash tests/gpu/train_proof.sh --model smoke|qwen|smoke-sample
# Trains with `kaiyuan train`, stops at a checkpoint (train.exit_interval), restarts the same
# command, and writes benchmarks/results-style JSON ($out/RECIPE_train.json) plus the logs and metrics under $out.
# smoke-sample: one uninterrupted gpt_smoke run on the default data (the bundled sample corpus).
set -euo pipefail
source tests/gpu/flags.sh
flag model "" "required: smoke (gpt_smoke, 200 steps, stop at 100), qwen (qwen3_1p7b, 20 steps, stop at 10) or smoke-sample"
parse_flags "$@"
which=$opt_model
case "$which" in smoke|qwen|smoke-sample) ;; *) echo "train_proof.sh: --model smoke|qwen|smoke-sample, not '$which'" >&2; exit 2 ;; esac
source tests/gpu/env.sh
root=/tmp/runs
case "$which" in
  smoke)
    recipe=gpt_smoke
    args=(kaiyuan.run_root=$root checkpoint.save_interval=100)
    first=(train.exit_interval=100)
    second=()
    ;;
  smoke-sample)
    # The default data: the bundled sample corpus with the bundled tokenizer, one uninterrupted run.
    recipe=gpt_smoke
    args=(kaiyuan.run_root=$root train.train_iters=100)
    ;;
  qwen)
    recipe=qwen3_1p7b
    # 20 steps at a global batch that fits the time box; everything else as the recipe.
    args=(kaiyuan.run_root=$root train.train_iters=20 train.global_batch_size=8 logger.log_interval=1
          scheduler.lr_warmup_iters=5 scheduler.lr_wsd_decay_iters=5 checkpoint.save_interval=10)
    first=(train.exit_interval=10)
    second=(checkpoint.save_optim=false)   # the disk holds one full 2B checkpoint with optimizer state
    ;;
esac
python3 -c "import torch; print(torch.cuda.get_device_name(0))"
if [ "$which" = smoke-sample ]; then
  kaiyuan train "$recipe" "${args[@]}" 2>&1 | tee "$out/${recipe}_launch1.log" | grep -E "iteration|saved|error|Error" | tail -40
  cmd="kaiyuan train $recipe ${args[*]}"
  logs=("$out/${recipe}_launch1.log")
else
  kaiyuan train "$recipe" "${args[@]}" "${first[@]}" 2>&1 | tee "$out/${recipe}_launch1.log" | grep -E "iteration|saved|error|Error" | tail -40
  kaiyuan train "$recipe" "${args[@]}" "${second[@]}" 2>&1 | tee "$out/${recipe}_launch2.log" | grep -E "iteration|saved|loading|error|Error" | tail -40
  cmd="kaiyuan train $recipe ${args[*]} ${first[*]} ; kaiyuan train $recipe ${args[*]} ${second[*]}"
  logs=("$out/${recipe}_launch1.log" "$out/${recipe}_launch2.log")
fi
python3 benchmarks/train_report.py "$root/$recipe" --name "${recipe}_${which}_train" --command "bash tests/gpu/train_proof.sh --model $which  # $cmd" \
  --out "$out/${recipe}_train.json" --log "${logs[@]}"
cp "$root/$recipe/run_state/metrics.jsonl" "$out/${recipe}_metrics.jsonl"
ls -la "$root/$recipe/checkpoints"
