#!/usr/bin/env bash
# Stop and resume on one CUDA GPU with the package installed, from the repository root (~10 minutes):
#   bash tests/gpu/stop_resume.sh
# gpt_smoke three ways, same seed and data: two uninterrupted runs (the second is the control: it says
# how deterministic training is on this GPU at all), and one started with `kaiyuan start`, stopped with
# `kaiyuan stop` at a random step (SIGTERM -> checkpoint), restarted with the same command. The report
# compares the 20 losses after the stop with the uninterrupted run: $out/stop_resume.json (+ the three runs' logs,
# stop.json, and on any exit the interrupted run's stacks, logs and state).
#   bash tests/gpu/stop_resume.sh --layer-spec local --extra "kaiyuan.cuda_graph=true"   (resume with a whole-step graph)
set -euo pipefail
source tests/gpu/flags.sh
flag layer-spec local "kaiyuan.layer_spec of all three runs (local: bit-reproducible on the H200)"
flag iters 45 "training iterations"
flag extra "" "more overrides for all three runs, space-separated"
flag start-timeout 240 "seconds the interrupted run may take to reach the step it is stopped at"
flag resume-timeout 240 "seconds the resumed run may take to finish"
parse_flags "$@"
source tests/gpu/env.sh
root=/tmp/stop_resume; rm -rf "$root"
# Even on a timeout: a run still going first says where its ranks are (kaiyuan stacks), then the logs are kept.
trap 'kaiyuan stacks interrupted --run-root "$root" > "$out/stacks.txt" 2>&1 || true
      cp "$root"/interrupted/logs/* "$root"/interrupted/run_state/*.json* "$out/" 2>/dev/null || true' EXIT
# The local spec: two same-seed runs of it were bit-identical on the H200, while the fast spec's (SDPA
# attention backward) differed from step 3 (benchmarks/results/2026-11-30_determinism_gpt_smoke.json). Micro batch 2
# keeps three of them (27 GB each) on one GPU.
common=(kaiyuan.run_root=$root kaiyuan.layer_spec=$opt_layer_spec train.train_iters=$opt_iters
        train.global_batch_size=8 train.micro_batch_size=2 logger.log_interval=1
        scheduler.lr_warmup_iters=5 checkpoint.save_interval=1000)
# --extra: more overrides for all three runs, e.g. --extra "kaiyuan.cuda_graph=true" (resume with a whole-step graph).
read -ra extra <<< "$opt_extra"
common+=("${extra[@]}")
stop_at=$(python3 -c "import random; print(random.randint(8, 20))")
# The two uninterrupted runs share the GPU with the interrupted one (gpt_smoke at batch 8 is small):
# same kernels and shapes, so sharing changes timing, not numerics.
pids=()
for ref in reference control; do
  kaiyuan train gpt_smoke kaiyuan.run_name=$ref "${common[@]}" > "$out/stop_resume_$ref.log" 2>&1 & pids+=($!)
done
kaiyuan start gpt_smoke interrupted "${common[@]}"
deadline=$((SECONDS + opt_start_timeout))
until python3 - "$root/interrupted/run_state/metrics.jsonl" "$stop_at" <<'PY'
import json, sys
try:
    steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
except FileNotFoundError:
    steps = []
sys.exit(0 if steps and steps[-1]["iteration"] >= int(sys.argv[2]) else 1)
PY
do
  if [ $SECONDS -gt $deadline ]; then
    echo "no step $stop_at within ${opt_start_timeout}s"; kaiyuan status interrupted --run-root "$root"
    exit 1
  fi
  sleep 0.2
done
kaiyuan stop interrupted --run-root "$root" --grace 240 | tee "$out/stop.json"
kaiyuan start gpt_smoke interrupted "${common[@]}"
deadline=$((SECONDS + opt_resume_timeout))
while kaiyuan status interrupted --run-root "$root" | grep -q '"state": "running"'; do
  if [ $SECONDS -gt $deadline ]; then echo "the resumed run did not end within ${opt_resume_timeout}s"; exit 1; fi
  sleep 2
done
kaiyuan status interrupted --run-root "$root"
wait "${pids[@]}"
python3 tests/gpu/stop_resume_report.py "$root" --stop-requested-at "$stop_at" --out "$out/stop_resume.json" \
  --stop-result "$out/stop.json" \
  --command "bash tests/gpu/stop_resume.sh --layer-spec $opt_layer_spec --extra '$opt_extra'"
