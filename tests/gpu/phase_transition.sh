#!/usr/bin/env bash
# A two-phase curriculum's phase change on one CUDA GPU with the package installed, from the repository root:
#   bash tests/gpu/phase_transition.sh
# The sample corpus split into two phases (English, then Chinese); gpt_smoke trains phase 1, then
# `--phase 2` resumes it with the new blend. The report shows the resume iteration, the blend switch
# and the LR on both sides of the boundary. Writes $out/phase1.log, phase2.log and phase_transition.json.
# On a CPU host, --dry-run resolves both launches without training:
#   bash tests/gpu/phase_transition.sh --dry-run --python .venv/bin/python
set -euo pipefail
source tests/gpu/flags.sh
switch dry-run "resolve both launches (kaiyuan train --dry-run), train nothing; no wheel install"
flag python python3 "the Python that runs kaiyuan and the report"
flag work /tmp/phase_proof "scratch directory (emptied first): the converted phases, the curriculum, the run"
parse_flags "$@"
source tests/gpu/env.sh
py=$opt_python
work=$opt_work; rm -rf "$work"; mkdir -p "$work/in1" "$work/in2"
corpus=kaiyuan_recipes/data/sample_corpus
cp "$corpus/en_jargon.parquet" "$work/in1/"; cp "$corpus/zh_poems.parquet" "$work/in2/"
for n in 1 2; do
  kaiyuan data convert --input-dir "$work/in$n" --output-dir "$work/phase$n" --output-prefix "phase$n" --num-shards 1
done
# 60 + 40 steps of 16 x 4096 tokens: warmup in phase 1, decay over phase 2.
cat > "$work/two_phases.yaml" <<YAML
seq_length: 4096
global_batch_size: 16
phases:
  1: {tokens: 3932160, sources: [{name: phase1, dir: $work/phase1, weight: tokens}]}
  2: {tokens: 2621440, sources: [{name: phase2, dir: $work/phase2, weight: tokens}]}
YAML
args=(kaiyuan.run_root="$work/runs" kaiyuan.run_name=two_phase kaiyuan.curriculum="$work/two_phases.yaml"
      scheduler.lr_warmup_iters=10 logger.log_interval=1 checkpoint.save_interval=1000)
dry=(); [ "$opt_dry_run" = 1 ] && dry=(--dry-run --json)
kaiyuan train gpt_smoke --phase 1 "${args[@]}" "${dry[@]}" 2>&1 | tee "$out/phase1.log" | grep -E "iteration +[0-9]+/|train_iters|error|Error" | tail -8
kaiyuan train gpt_smoke --phase 2 "${args[@]}" "${dry[@]}" 2>&1 | tee "$out/phase2.log" | grep -E "iteration +[0-9]+/|train_iters|error|Error" | tail -8
[ "$opt_dry_run" = 1 ] && exit 0
"$py" benchmarks/train_report.py "$work/runs/two_phase" --name gpt_smoke_phase_transition \
  --command "bash tests/gpu/phase_transition.sh" --out "$out/phase_transition.json" --log "$out/phase1.log" "$out/phase2.log"
