#!/usr/bin/env bash
# kaiyuan.heldout_eval (the held-out set scored during training) on one CUDA GPU with the package installed, from
# the repository root (~15 minutes):
#   bash tests/gpu/inloop_eval.sh --rev REV
# A synthetic held-out input of 7 dimensions x --per-dimension samples (half of them 4-choice questions) goes through
# `kaiyuan data heldout`; gpt_smoke trains on its defaults (fast spec and its whole-step CUDA graph where no TE) for
# --iters iterations with the held-out set scored every --interval; the checkpoint of the last iteration is exported
# and `kaiyuan eval heldout` scores it: per-sample NLL and MCQ predictions against the in-training figures of that
# iteration. The same check for qwen3_1p7b (10 steps). With --baseline, gpt_smoke again without the evaluation
# (step time with and without). Then the in-process bf16 equality test (test_heldout_eval_gpu.py). The report
# (inloop_eval_report.py) writes inloop_eval.json (command, revision, GPU, curves, eval time and share of training,
# equality) and inloop_eval.png (per-dimension curves) under --out.
set -euo pipefail
source tests/gpu/flags.sh
flag rev "unknown" "the revision under test (recorded in the JSON)"
flag part "all" "smoke | qwen | all"
flag iters 200 "gpt_smoke's training iterations"
flag interval 20 "kaiyuan.heldout_eval_interval for gpt_smoke"
flag per-dimension 400 "held-out samples per dimension"
switch baseline "also train gpt_smoke without the evaluation, for the step time without it"
parse_flags "$@"
source tests/gpu/env.sh
work=/tmp/inloop_eval
rm -rf "$work" && mkdir -p "$work"
python3 tests/gpu/inloop_eval_report.py make-input "$work/input.jsonl" --per-dimension "$opt_per_dimension"
kaiyuan data heldout "$work/input.jsonl" --output-dir "$work/heldout" --per-dimension "$opt_per_dimension" \
  > "$out/data_heldout.json"
data=$work/heldout/heldout_prompt_completion.jsonl

train_and_check() {  # NAME RECIPE ITERS INTERVAL [OVERRIDES...]
  local name=$1 recipe=$2 iters=$3 interval=$4; shift 4
  kaiyuan train "$recipe" kaiyuan.run_root="$work/runs" kaiyuan.run_name="$name" kaiyuan.heldout_eval="$data" \
    kaiyuan.heldout_eval_interval="$interval" train.train_iters="$iters" checkpoint.save_interval="$iters" \
    checkpoint.save_optim=false checkpoint.save_rng=false "$@" > "$out/${name}_train.log" 2>&1 \
    || { tail -40 "$out/${name}_train.log"; exit 1; }
  grep "held-out evaluation" "$out/${name}_train.log" | tail -3
  kaiyuan status "$name" --run-root "$work/runs" > "$out/${name}_status.json"
  cp "$work/runs/$name/run_state/metrics.jsonl" "$out/${name}_metrics.jsonl"
  cp "$work/runs/$name/heldout_eval/iter_$(printf %07d "$iters").json" "$out/${name}_in_training.json"
  kaiyuan export hf "$work/runs/$name" "$work/${name}_hf" > "$out/${name}_export.log" 2>&1
  local max_length  # the in-training scorer's (dataset.seq_length), so both cut the same samples
  max_length=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_length'])" \
    "$out/${name}_in_training.json")
  kaiyuan eval heldout --model "$work/${name}_hf" --data "$data" --out "$out/${name}_post_hoc" --device cuda \
    --max-length "$max_length" > /dev/null
}

if [ "$opt_part" = smoke ] || [ "$opt_part" = all ]; then
  train_and_check smoke gpt_smoke "$opt_iters" "$opt_interval"
  if [ "$opt_baseline" = 1 ]; then
    kaiyuan train gpt_smoke kaiyuan.run_root="$work/runs" kaiyuan.run_name=smoke_base train.train_iters="$opt_iters" \
      checkpoint.save_interval="$opt_iters" checkpoint.save_optim=false checkpoint.save_rng=false \
      > "$out/smoke_base_train.log" 2>&1
    cp "$work/runs/smoke_base/run_state/metrics.jsonl" "$out/smoke_base_metrics.jsonl"
  fi
fi
if [ "$opt_part" = qwen ] || [ "$opt_part" = all ]; then
  train_and_check qwen qwen3_1p7b 10 10 train.global_batch_size=8
fi
python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_heldout_eval_gpu.py 2>&1 | tee "$out/pytest_gpu.log" | tail -5
python3 tests/gpu/inloop_eval_report.py report --out "$out" --rev "$opt_rev" \
  --command "bash tests/gpu/inloop_eval.sh $*" --interval "$opt_interval"
