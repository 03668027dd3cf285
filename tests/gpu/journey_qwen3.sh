#!/usr/bin/env bash
# The journey of the model users train, qwen3_1p7b, on its recipe defaults: only the run length
# (train.train_iters) and the run root are overridden. From the repository root, on one CUDA GPU with the package
# installed (`make env`; lm-eval for the parity step), about 20 minutes:
#   bash tests/gpu/journey_qwen3.sh [--out DIR] [--rev REV] [--iters N]
# start (detached) -> status through set-up and training (time to the first step, every state seen) -> stop
# mid-training (checkpoint at the stop) -> restart resumes at the next iteration -> stop -> ckpt ls / verify ->
# export hf -> serve (the original scripts' curl, an OpenAI client completion, lm-eval local-completions against
# lm-eval hf on the same export) -> data heldout + eval heldout -> phase 2 of a two-phase curriculum from this run
# (its indices built first by `kaiyuan data index`, then its launch timed to the first step).
# Every step's exit code, wall time and log land in DIR/logs_qwen3 (tests/gpu/journey_report.py reads them).
set -uo pipefail
source tests/gpu/flags.sh
flag rev unknown "the git revision the tree was at, recorded in the results"
flag iters 40 "train.train_iters of the run (the run is stopped before it ends)"
flag port 5000 "the port kaiyuan serve listens on"
flag part all "all: the whole journey; start: only start -> first step -> stop -> restart -> next step -> stop; first-step: start -> first step -> stop"
flag recipe qwen3_1p7b "the recipe, on its defaults (first-step times another, e.g. laoyao_moe_2b)"
flag data "" "kaiyuan.data for the run (default: the recipe's; laoyao_moe_2b's own data is not on every host: sample)"
parse_flags "$@"
source tests/gpu/env.sh
source tests/gpu/serve_lifecycle.sh  # wait_until, port_open, start_server, stop_server
root=/tmp/journey_qwen3; runs=$root/runs; logs=$root/logs_qwen3; steps=$logs/journey_steps_qwen3.jsonl
run=q1 recipe=$opt_recipe
rm -rf "$root"; mkdir -p "$logs"; : > "$steps"
trap '[ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null; tar czf "$out/journey_qwen3.tgz" -C "$root" logs_qwen3' EXIT
trap 'exit 143' TERM
source tests/gpu/journey_lib.sh  # step, expect_state, not_running, reached
python3 - "$opt_rev" "$recipe" > "$logs/journey_meta_qwen3.json" <<'PY'
import json, socket, subprocess, sys
from kaiyuan_recipes.doctor import installed_versions
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout
except OSError:
    gpu = ""
print(json.dumps({"part": "qwen3", "recipe": sys.argv[2], "rev": sys.argv[1], "stack": "bridge", "host": socket.gethostname(),
                  "gpu": (gpu.splitlines() or ["none"])[0],
                  "versions": {d: v for d, v in installed_versions().items() if v}}))
PY
overrides=(kaiyuan.run_root=$runs train.train_iters=$opt_iters ${opt_data:+kaiyuan.data=$opt_data})

watch_until_step() {  # watch_until_step AFTER_ITERATION LIMIT_S TAG: poll status every second until the run's
  # metrics log a step past AFTER_ITERATION; every status answer goes to $logs/status_TAG.jsonl with its time
  local after=$1 limit=$2 tag=$3 t0=$SECONDS
  while [ $((SECONDS - t0)) -le "$limit" ]; do
    kaiyuan status $run --run-root $runs 2>&1 | python3 -c 'import json, sys, time
text = sys.stdin.read()
try:
    answer = json.loads(text)
except ValueError:
    answer = {"raw": text.strip()[-400:]}
print(json.dumps({"t": time.time(), "status": answer}))' >> "$logs/status_$tag.jsonl"
    reached $run $((after + 1)) && return 0
    # a run that ended without the step (refused, failed) is not waited for
    tail -1 "$logs/status_$tag.jsonl" | grep -qE '"state": "(failed|stopped|finished|lost)"' && return 1
    sleep 1
  done
  return 1
}

last_saved() {  # the newest checkpoint's iteration
  cat $runs/$run/checkpoints/latest_checkpointed_iteration.txt
}

keep_newest_checkpoint() {  # the host's disk holds two qwen3 checkpoints with optimizer state at most
  local newest; newest=$(last_saved)
  for d in $runs/$run/checkpoints/iter_*; do
    [ "$d" = "$(printf '%s/iter_%07d' $runs/$run/checkpoints "$newest")" ] || rm -rf "$d"
  done
}

echo "{\"t\": $(date +%s.%N), \"event\": \"launch\"}" > "$logs/launch_1.json"
step start 0 kaiyuan start $recipe $run "${overrides[@]}" || exit 1
step first_step 0 watch_until_step 0 600 1 || exit 1
step stop 0 kaiyuan stop $run --run-root $runs --grace 300
step status_stopped 0 expect_state $run stopped
if [ "$opt_part" = first-step ]; then
  cp $runs/$run/logs/console.log "$logs/q1_console.log" 2>/dev/null
  cp $runs/$run/run_state/metrics.jsonl "$logs/q1_metrics.jsonl" 2>/dev/null
  rm -rf "$runs"; exit 0
fi
saved=$(last_saved); echo "saved at $saved"
echo "{\"t\": $(date +%s.%N), \"event\": \"launch\", \"resumes_from\": $saved}" > "$logs/launch_2.json"
step restart 0 kaiyuan start $recipe $run "${overrides[@]}"
step resumed_step 0 watch_until_step "$saved" 600 2
step stop_2 0 kaiyuan stop $run --run-root $runs --grace 300
step status_stopped_2 0 expect_state $run stopped
cp $runs/$run/run_state/metrics.jsonl "$logs/q1_metrics.jsonl" 2>/dev/null
cp $runs/$run/logs/console.log "$logs/q1_console.log" 2>/dev/null
# what the console showed before the first iteration line of the first start
awk '/^kaiyuan: iteration [0-9]/ {print NR - 1; exit}' "$logs/q1_console.log" > "$logs/console_lines_before_first_iteration.txt"
if [ "$opt_part" = start ]; then rm -rf "$runs"; exit 0; fi  # two checkpoints: the disk holds no third
step keep_newest 0 keep_newest_checkpoint
step ckpt_ls 0 kaiyuan ckpt ls $runs/$run
step ckpt_verify 0 kaiyuan ckpt verify $runs/$run
step export 0 kaiyuan export hf $runs/$run $root/hf || exit 1
step port_free 0 eval "! port_open $opt_port"
start_server "$logs/serve.log" "$opt_port" $root/hf
step serve_ready 0 wait_until 300 curl -sf http://localhost:$opt_port/health
step curl_megatron 0 curl -sf "http://localhost:$opt_port/api" -X 'PUT' -H 'Content-Type: application/json; charset=UTF-8' \
  -d '{"prompts":["The Jargon File is", "床前明月光，"], "tokens_to_generate":50, "temperature":0.8, "top_k":0, "top_p":0.9}'
step openai_client 0 python3 -c "
from openai import OpenAI
c = OpenAI(base_url='http://localhost:$opt_port/v1', api_key='none')
r = c.completions.create(model='kaiyuan', prompt='A hacker is', max_tokens=32, temperature=0)
print(r.model_dump_json())"
step lm_eval_parity 0 python3 tests/gpu/lm_eval_parity.py --model $root/hf --port $((opt_port + 1)) \
  --out "$logs/lm_eval_parity.json"
step server_stopped 0 stop_server $server_pid $opt_port
write_heldout_input $root/heldout.jsonl
step heldout_data 0 kaiyuan data heldout $root/heldout.jsonl --output-dir $root/heldout --per-dimension 4
step eval 0 kaiyuan eval heldout --model $root/hf --data $root/heldout/heldout_prompt_completion.jsonl \
  --out "$logs/eval" --device cuda
rm -rf $root/hf
# Phase 2 of a two-phase curriculum whose phase 1 is what this run trained (its last saved iteration).
corpus=kaiyuan_recipes/data/sample_corpus
mkdir -p $root/in2; cp $corpus/zh_poems.parquet $root/in2/
step convert_phase2 0 kaiyuan data convert --input-dir $root/in2 --output-dir $root/phase2 --output-prefix phase2 --num-shards 1
tokens_per_step=$((512 * 4096)); saved=$(last_saved)
cat > $root/two_phases.yaml <<YAML
seq_length: 4096
global_batch_size: 512
phases:
  1: {tokens: $((saved * tokens_per_step)), sources: [{name: phase2, dir: $root/phase2, weight: tokens}]}
  2: {tokens: $((2 * tokens_per_step)), sources: [{name: phase2, dir: $root/phase2, weight: tokens}]}
YAML
phase2=(--phase 2 kaiyuan.curriculum=$root/two_phases.yaml kaiyuan.run_name=$run kaiyuan.run_root=$runs)
# The phase's indices built on the CPU first (what a cluster user does before a phase's GPU launch), then the
# launch: its time to the first step is launch 3's (journey_report.py).
step index_phase2 0 kaiyuan data index $recipe "${phase2[@]}"
step index_phase2_again 0 kaiyuan data index $recipe "${phase2[@]}"
echo "{\"t\": $(date +%s.%N), \"event\": \"launch\", \"resumes_from\": $saved}" > "$logs/launch_3.json"
step phase2 0 kaiyuan train $recipe "${phase2[@]}"
step status_phase2 0 expect_state $run finished
cp $runs/$run/run_state/metrics.jsonl "$logs/q1_metrics.jsonl" 2>/dev/null
grep -c '"ok": true' "$steps"; ! grep '"ok": false' "$steps"
