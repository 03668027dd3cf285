#!/usr/bin/env bash
# The user journey on the recipe defaults, nothing overridden but the run root, on one CUDA GPU with the package
# installed (`make env`). From the repository root, each part about 5-10 minutes:
#   bash tests/gpu/journey.sh --part foreground   # train -> status -> export -> serve (+ the original curl,
#                                                 #   an OpenAI completion) -> held-out data + eval -> phase 2 -> export
#   bash tests/gpu/journey.sh --part detached     # start, a second start refused, stop mid-run, status, restart
#                                                 #   resumes, status finished (the original scripts' workflow)
# Each part's logs are packed into --out/journey_PART.tgz; the report (any host):
#   tar xzf journey_PART.tgz; python3 tests/gpu/journey_report.py logs_foreground logs_detached \
#       --out benchmarks/results/DATE_journey.json
# --rev REV records the git revision of the tree. --stack names the stack the environment has, recorded with the
# results: bridge (the default environment), fw2606 (NeMo Framework 26.06's Megatron side, constraints/fw2606.txt),
# te (Transformer Engine importable, so the defaults' `auto` trains on TE's spec, as in an NGC container; a TE
# outside the environment comes first on PYTHONPATH from KAIYUAN_TE_SITE).
set -uo pipefail
source tests/gpu/flags.sh
flag part all "foreground, detached, or all (both, one after the other)"
flag rev unknown "the git revision the tree was at, recorded in the results"
flag stack bridge "the stack the environment has: bridge, fw2606 or te"
parse_flags "$@"
part=$opt_part rev=$opt_rev stack=$opt_stack
case $part in foreground|detached|all) ;; *) echo "journey.sh: --part foreground|detached|all, not '$part'" >&2; exit 2 ;; esac
case $stack in
  bridge) ;;
  fw2606) ;;  # the environment the script is given holds that stack (constraints/fw2606.txt)
  te) [ -n "${KAIYUAN_TE_SITE:-}" ] && export PYTHONPATH="$KAIYUAN_TE_SITE${PYTHONPATH:+:$PYTHONPATH}" ;;
  *) echo "journey.sh: --stack bridge|fw2606|te, not '$stack'" >&2; exit 2 ;;
esac
source tests/gpu/env.sh
source tests/gpu/serve_lifecycle.sh  # wait_until, start_server, stop_server
if [ "$stack" = te ] && ! python3 -c 'import torch, transformer_engine.pytorch' 2>/dev/null; then
  echo "journey.sh: --stack te: transformer_engine.pytorch does not import" \
    "(install Transformer Engine, or name its folder in KAIYUAN_TE_SITE)" >&2; exit 2
fi
# Every log goes to $logs, packed into one $out/journey_PART.tgz at the end (one file to keep or copy).
root=/tmp/journey; runs=$root/runs; logs=$root/logs_$part; steps=$logs/journey_steps_$part.jsonl
rm -rf "$logs"; mkdir -p "$logs"; : > "$steps"
# (a server still running at exit, a timeout's during serving, is stopped: nothing outlives the journey)
trap '[ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null; tar czf "$out/journey_$part.tgz" -C "$root" "logs_$part"' EXIT
trap 'exit 143' TERM  # (a timeout's SIGTERM still packs the logs)
python3 - "$part" "$rev" "$stack" > "$logs/journey_meta_$part.json" <<'PY'
import json, socket, subprocess, sys
from kaiyuan_recipes.doctor import installed_versions  # the versions doctor judges, read the same way
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout
except OSError:
    gpu = ""
print(json.dumps({"part": sys.argv[1], "rev": sys.argv[2], "stack": sys.argv[3], "host": socket.gethostname(),
                  "gpu": (gpu.splitlines() or ["none"])[0],
                  "versions": {d: v for d, v in installed_versions().items() if v}}))
PY

source tests/gpu/journey_lib.sh  # step, expect_state, not_running, reached

prepare_data() {  # the held-out file and set, and the two phases' data: the sample corpus, English then Chinese
  write_heldout_input $root/heldout.jsonl
  step heldout_data 0 kaiyuan data heldout $root/heldout.jsonl --output-dir $root/heldout --per-dimension 4
  # Phase 2 of a two-phase curriculum whose phase 1 is the 200 default steps above (16 x 4096 tokens each).
  local corpus=kaiyuan_recipes/data/sample_corpus
  mkdir -p $root/in1 $root/in2; cp $corpus/en_jargon.parquet $root/in1/; cp $corpus/zh_poems.parquet $root/in2/
  step convert_phase1 0 kaiyuan data convert --input-dir $root/in1 --output-dir $root/phase1 --output-prefix phase1 --num-shards 1
  step convert_phase2 0 kaiyuan data convert --input-dir $root/in2 --output-dir $root/phase2 --output-prefix phase2 --num-shards 1
  cat > $root/two_phases.yaml <<YAML
seq_length: 4096
global_batch_size: 16
phases:
  1: {tokens: 13107200, sources: [{name: phase1, dir: $root/phase1, weight: tokens}]}
  2: {tokens: 2621440, sources: [{name: phase2, dir: $root/phase2, weight: tokens}]}
YAML
}

foreground() {
  step doctor any kaiyuan doctor --json  # the stack and whether the matrix has it (the host's torch may be outside)
  step train 0 kaiyuan train gpt_smoke kaiyuan.run_root=$runs || return 1
  prepare_data & local data_prep=$!  # CPU work, beside the export and the server
  step status 0 expect_state gpt_smoke finished
  step export 0 kaiyuan export hf $runs/gpt_smoke $root/hf || return 1
  step port_free 0 eval "! port_open 5000"  # else serve_ready and the curls would reach a leftover server
  start_server "$logs/serve.log" 5000 $root/hf
  step serve_ready 0 wait_until 300 curl -sf http://localhost:5000/health
  # The original scripts' curl, verbatim.
  step curl_megatron 0 curl -sf 'http://localhost:5000/api' -X 'PUT' -H 'Content-Type: application/json; charset=UTF-8' \
    -d '{"prompts":["The Jargon File is", "床前明月光，"], "tokens_to_generate":50, "temperature":0.8, "top_k":0, "top_p":0.9}'
  step openai_completion 0 curl -sf http://localhost:5000/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"kaiyuan","prompt":"A hacker is","max_tokens":32,"temperature":0}'
  step server_stopped 0 stop_server $server_pid 5000
  step data_ready 0 wait $data_prep
  step eval 0 kaiyuan eval heldout --model $runs/gpt_smoke --data $root/heldout/heldout_prompt_completion.jsonl \
    --out "$logs/eval" --device cuda
  step phase2 0 kaiyuan train gpt_smoke --phase 2 kaiyuan.curriculum=$root/two_phases.yaml kaiyuan.run_root=$runs
  step status_phase2 0 expect_state gpt_smoke finished
  step export_phase2 0 kaiyuan export hf $runs/gpt_smoke $root/hf_phase2
  cp $runs/gpt_smoke/run_state/metrics.jsonl "$logs/gpt_smoke_metrics.jsonl" 2>/dev/null
}

detached() {
  step start 0 kaiyuan start gpt_smoke detached kaiyuan.run_root=$runs || return 1
  step second_start_refused nonzero kaiyuan start gpt_smoke detached kaiyuan.run_root=$runs
  step reach_step_50 0 wait_until 300 reached detached 50
  step stop 0 kaiyuan stop detached --run-root $runs --grace 300
  step status_stopped 0 expect_state detached stopped
  step restart 0 kaiyuan start gpt_smoke detached kaiyuan.run_root=$runs
  step run_to_end 0 wait_until 480 not_running detached
  step status_finished 0 expect_state detached finished
  cp $runs/detached/run_state/metrics.jsonl "$logs/detached_metrics.jsonl" 2>/dev/null
  cp $runs/detached/logs/console.log "$logs/detached_console.log" 2>/dev/null
}

case $part in
  foreground) rm -rf "$root"/runs/gpt_smoke "$root"/hf* "$root"/heldout*; foreground ;;
  detached) rm -rf "$root"/runs/detached; detached ;;
  all) rm -rf "$runs" "$root"/hf* "$root"/heldout*; foreground; detached ;;
esac
grep -c '"ok": true' "$steps"; ! grep '"ok": false' "$steps"
