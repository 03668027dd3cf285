#!/usr/bin/env bash
# The fast spec's numerics against the local spec's on one CUDA GPU with the package installed, from the
# repository root (about 30 minutes for every run):
#   bash tests/gpu/fast_vs_local.sh
# On two GPUs, half the time: the runs split over the GPUs, then the report alone (--report-only trains none):
#   CUDA_VISIBLE_DEVICES=0 bash tests/gpu/fast_vs_local.sh --runs local &
#   CUDA_VISIBLE_DEVICES=1 bash tests/gpu/fast_vs_local.sh --runs "fast fast_fused_ce"; wait
#   bash tests/gpu/fast_vs_local.sh --report-only
# gpt_smoke, 200 steps on the bundled sample corpus, same seed: the local spec, the fast spec, and the fast
# spec with Megatron's fused cross-entropy instead of the chunked one (same function; only the rounding of the
# logits' gradient differs: it casts it to bf16). The loss logged every 10 steps (Megatron's average over the
# interval) must agree within 1 % after warmup. The third run is the noise floor of that comparison: the
# sample corpus is ~437k tokens, so 200 x 65,536 tokens is ~30 epochs of memorisation, where rounding alone
# moves the curve. So each run also comes in a one-pass form (*_onepass: one 1,024-token sequence a step, 200
# steps = ~0.5 epoch), where the curves compare functions rather than memorisation.
# The optional fast_foreach_adam run (--runs fast_foreach_adam_onepass) tells whether the fused AdamW step is why
# the fast spec's one-pass loss differs from the local's.
# Writes $out/RUN.log per run and $out/fast_vs_local.json (the pairs' report, benchmarks/determinism_report.py).
set -euo pipefail
source tests/gpu/flags.sh
all_runs="local fast fast_fused_ce local_onepass fast_onepass fast_fused_ce_onepass"
flag runs "" "train only these runs (of: $all_runs fast_foreach_adam fast_foreach_adam_onepass), one part of a split run: no report (default: all six, then the report)"
switch report-only "train nothing; write the report from the logs already in --out"
parse_flags "$@"
source tests/gpu/env.sh
root=/tmp/fast_vs_local
declare -A extra=([local]="kaiyuan.layer_spec=local" [fast]="kaiyuan.layer_spec=fast"
                  [fast_fused_ce]="kaiyuan.layer_spec=fast kaiyuan.chunked_loss=false"
                  [fast_foreach_adam]="kaiyuan.layer_spec=fast kaiyuan.fused_adamw=false")
note="*_onepass: global batch 1 x 1,024 tokens (~0.5 epoch)"
onepass="train.global_batch_size=1 train.micro_batch_size=1 dataset.seq_length=1024 model.seq_length=1024"
runs=${opt_runs:-$all_runs}; [ "$opt_report_only" = 1 ] && runs=""
for run in $runs; do
  rm -rf "${root:?}/$run"
  overrides=${extra[${run%_onepass}]}
  [ "$run" = "${run%_onepass}" ] || overrides="$overrides $onepass"
  # shellcheck disable=SC2086  # a list of overrides
  kaiyuan train gpt_smoke kaiyuan.run_root=$root kaiyuan.run_name=$run $overrides \
    train.train_iters=200 logger.log_interval=10 checkpoint.save_interval=1000 > "$out/$run.log" 2>&1
done
[ -z "$opt_runs" ] || [ "$opt_report_only" = 1 ] || exit 0  # a part of a split run: the report comes after
pairs=()
for suffix in "" _onepass; do
  [ -f "$out/local$suffix.log" ] && pairs+=(--pair "local_vs_fast$suffix"
                                             "$out/local$suffix.log" "$out/fast$suffix.log")
  [ -f "$out/fast_fused_ce$suffix.log" ] && pairs+=(--pair "noise_floor_fast_vs_fast_fused_ce$suffix"
                                                    "$out/fast$suffix.log" "$out/fast_fused_ce$suffix.log")
  [ -f "$out/fast_foreach_adam$suffix.log" ] && pairs+=(--pair "local_vs_fast_foreach_adam$suffix"
                                                        "$out/local$suffix.log" "$out/fast_foreach_adam$suffix.log")
done
python3 benchmarks/determinism_report.py "${pairs[@]}" --after 20 \
  --command "bash tests/gpu/fast_vs_local.sh" --out "$out/fast_vs_local.json" \
  --note "gpt_smoke 200 steps, sample corpus, seed 1234, log interval 10, after warmup; pairs (a, b); $note"
