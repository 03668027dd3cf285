#!/usr/bin/env bash
# NeMo 2's `nemo llm pretrain --factory "kaiyuan_gpt_smoke(max_steps=100)" -y` on the bundled sample corpus with
# the bundled tokenizer (checkpoints every --save-every steps, keep-K, TensorBoard), a restart that resumes, and
# `kaiyuan train gpt_smoke` for the same 100 steps (same data, seed, batch, schedule; the local spec and no fusions
# on both sides, so the kernels are comparable); the NeMo 2 checkpoint exported to HF and served; and
# `--factory kaiyuan_qwen3` beside `kaiyuan train qwen3_1p7b` on the same settings (tokens/s). Needs one CUDA GPU,
# the NeMo 2 environment for --python (`make env-nemo2`: .venv-nemo2/bin/python) and, for the kaiyuan, export and
# qwen parts' Megatron-Bridge side, `python3` with the package installed (`make env`). One part at a time, in order
# (each reads the previous one's /tmp/nemo2_pretrain), each under 10 minutes:
#   bash tests/gpu/nemo2_env.sh --python PY                        # the NeMo 2 environment's versions, a dry run
#   bash tests/gpu/nemo2_pretrain.sh --python PY --part nemo       # 100 steps
#   bash tests/gpu/nemo2_pretrain.sh --python PY --part resume     # restart: resumes at 100, on to --resume-to;
#                                                                  #   then the checkpoint's weights (NeMo's loader)
#   bash tests/gpu/nemo2_pretrain.sh --part kaiyuan                # the Megatron-Bridge side
#   bash tests/gpu/nemo2_pretrain.sh --part export                 # the resumed NeMo 2 weights -> HF -> kaiyuan serve
#   bash tests/gpu/nemo2_pretrain.sh --python PY --part qwen       # both sides' qwen3_1p7b, --qwen-steps each
# resume and kaiyuan share no files but the data cache (written by nemo), so they may run side by side (loss curves,
# not timings, are what they measure); qwen times steps: nothing beside it.
# Results under --out: nemo2_PART.tgz (every log, the loss curve as JSON lines, the checkpoints kept) and
# nemo2_PART.json (the summary); tests/gpu/nemo2_report.py turns them into the result file and its plot.
set -uo pipefail
source tests/gpu/flags.sh
source tests/gpu/nemo2_env.sh
nemo2_flags
flag part "" "required: nemo, resume, kaiyuan, export or qwen"
flag port 5001 "export: the port kaiyuan serve listens on"
flag steps 100 "training steps (both sides; the schedule is the recipe's, fitted to them)"
flag save-every 20 "checkpoint interval (more saves than keep-K's 3, so that pruning shows)"
flag resume-to 110 "resume: train on from the last checkpoint to this step"
flag timeout 480 "seconds each training command may take"
flag qwen-steps 20 "qwen: training steps on each side"
flag qwen-batch 8 "qwen: global batch (micro-batch 2, seq 4096: the recipe's; one GPU)"
parse_flags "$@"
case $opt_part in nemo|resume|kaiyuan|export|qwen) ;; *) echo "nemo2_pretrain.sh: --part nemo|resume|kaiyuan|export|qwen, not '$opt_part'" >&2; exit 2 ;; esac
part=$opt_part steps=$opt_steps
root=/tmp/nemo2_pretrain; runs=$root/runs; logs=$root/logs_$part
out=$opt_out; mkdir -p "$out"
rm -rf "$logs"; mkdir -p "$logs"
trap 'tar czf "$out/nemo2_$part.tgz" -C "$root" "logs_$part"; cp "$logs/summary.json" "$out/nemo2_$part.json" 2>/dev/null' EXIT
trap 'exit 143' TERM
# Both sides tokenize the sample corpus into the same cache, so they read the same files.
export KAIYUAN_CACHE=$root/cache
# The fusions that need TE or Apex, off on both sides (the local spec turns masked softmax off on the Bridge side too).
FUSIONS_OFF="masked_softmax_fusion cross_entropy_loss_fusion gradient_accumulation_fusion bias_activation_fusion
  bias_dropout_fusion apply_rope_fusion"
nemo_dir=$runs/nemo2
weights=$root/nemo2_weights.safetensors  # the resumed checkpoint's weights, for the export

run_logged() {  # run_logged NAME CMD...: CMD (a program, not a function) under --timeout, its output in $logs/NAME.log
  local name=$1; shift
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=30 "$opt_timeout" "$@" > "$logs/$name.log" 2>&1; local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"wall_s\": $((SECONDS - t0))}" >> "$logs/steps.jsonl"
  echo "[$name] rc=$rc $((SECONDS - t0))s"; tail -5 "$logs/$name.log"
  return $rc
}

nemo_pretrain() {  # nemo_pretrain NAME FACTORY [OVERRIDE...]: the issue's command
  local name=$1 factory=$2; shift 2
  local o overrides=()
  for o in $FUSIONS_OFF; do overrides+=("model.config.$o=false"); done
  # The factory picks the optimizer (compat.nemo2_distributed_optimizer_saves: the plain one without TE or Apex), as
  # a user gets it: nothing overridden here.
  # trainer.log_every_n_steps=1: a loss per step in TensorBoard, for the curve. ckpt_async_save=false: the recipe's
  # checkpoint.async_save, and what the Bridge side does.
  run_logged "$name" "$opt_python" -c "$NEMO_CLI" llm pretrain --factory "$factory" \
    trainer.log_every_n_steps=1 log.ckpt.every_n_train_steps="$opt_save_every" trainer.strategy.ckpt_async_save=false \
    "${overrides[@]}" "$@" -y
}

nemo_summary() {  # the loss curve from TensorBoard, the checkpoints kept, and what the log says about resuming
  "$opt_python" - "$nemo_dir" "$logs" "$part" "$1" <<'PY'
import glob, json, os, re, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run_dir, logs, part, log_name = sys.argv[1:]
rows = []
for f in sorted(glob.glob(f"{run_dir}/**/events.out.tfevents*", recursive=True)):
    acc = EventAccumulator(f, size_guidance={"scalars": 0})
    acc.Reload()
    for tag in acc.Tags()["scalars"]:
        rows += [{"file": os.path.basename(f), "tag": tag, "step": e.step, "value": e.value} for e in acc.Scalars(tag)]
with open(f"{logs}/nemo2_tb_scalars.jsonl", "w") as fh:
    fh.writelines(json.dumps(r) + "\n" for r in rows)
runs = []  # one per events file, i.e. per launch: a resumed launch's first step follows the last one's
for name in dict.fromkeys(r["file"] for r in rows):
    loss = sorted((r["step"], r["value"]) for r in rows if r["file"] == name and r["tag"] == "reduced_train_loss")
    if loss:
        runs.append({"file": name, "steps": [loss[0][0], loss[-1][0]], "first_loss": loss[0][1],
                     "last_loss": loss[-1][1]})
ckpts = sorted(os.listdir(f"{run_dir}/kaiyuan_gpt_smoke/checkpoints")) if os.path.isdir(
    f"{run_dir}/kaiyuan_gpt_smoke/checkpoints") else []
text = open(f"{logs}/{log_name}.log", errors="replace").read()
summary = {"part": part, "steps": [json.loads(l) for l in open(f"{logs}/steps.jsonl")],
           "tensorboard_runs": runs, "checkpoints": ckpts, "kept_not_last": len([c for c in ckpts if not c.endswith("-last")]),
           "resume_lines": re.findall(r".*(?:Restor|Resum)ing.*", text)[:5]}
json.dump(summary, open(f"{logs}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
}

serve_nemo2_export() {  # item 3: the NeMo 2 checkpoint's weights -> HF (kaiyuan export hf) -> kaiyuan serve answers
  if [ ! -f "$weights" ]; then
    echo "nemo2_pretrain.sh: no $weights: --part resume did not dump them on this machine" | tee "$logs/export_nemo2.log"
    return 1
  fi
  rm -rf "$root/nemo2_hf"
  run_logged export_nemo2 "$opt_python" -m kaiyuan_recipes.cli.main export hf "$weights" "$root/nemo2_hf" \
    --recipe gpt_smoke || return 1
  # The exported model's loss on the sample corpus: near NeMo's last training loss if the weights came through.
  run_logged hf_loss "$opt_python" - "$root/nemo2_hf" <<'PY'
import sys, pyarrow.parquet as pq, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
text = "\n".join(pq.read_table("kaiyuan_recipes/data/sample_corpus/en_jargon.parquet")["text"].to_pylist())
ids = torch.tensor(tok(text)["input_ids"][: 8 * 1024]).view(8, 1024).cuda()
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
with torch.no_grad():
    print(f"hf_loss {model(ids, labels=ids).loss.item():.4f} (8 x 1024 tokens of en_jargon)")
PY
  "$opt_python" -m kaiyuan_recipes.cli.main serve "$root/nemo2_hf" --port "$opt_port" > "$logs/serve.log" 2>&1 &
  local server=$! i
  for i in $(seq 180); do curl -sf http://localhost:$opt_port/health > /dev/null && break; sleep 1; done
  curl -sf "http://localhost:$opt_port/api" -X PUT -H 'Content-Type: application/json; charset=UTF-8' \
    -d '{"prompts":["The Jargon File is"], "tokens_to_generate":32, "temperature":0}' > "$logs/serve_api.json"
  echo "{\"step\": \"serve_api\", \"rc\": $?}" >> "$logs/steps.jsonl"
  curl -sf http://localhost:$opt_port/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"kaiyuan","prompt":"A hacker is","max_tokens":32,"temperature":0}' > "$logs/serve_completion.json"
  echo "{\"step\": \"serve_completion\", \"rc\": $?}" >> "$logs/steps.jsonl"
  kill $server; wait $server 2> /dev/null
  cat "$logs/serve_api.json" "$logs/serve_completion.json"
}

qwen_summary() {  # tokens/s of both sides from their per-step timings, the same steps skipped as warm-up
  "$opt_python" - "$logs" "$runs/nemo2_qwen" "$runs/bridge_qwen3/run_state/metrics.jsonl" "$opt_qwen_batch" <<'PY'
import glob, json, statistics, sys
logs, nemo_dir, bridge_metrics, batch = sys.argv[1:]
tokens = int(batch) * 4096
WARM = 5  # steps 1-5 are compile / allocator warm-up on both sides
# NeMo's step time as the Bridge side's is taken (kaiyuan_recipes.training.metrics: from one step's end to the
# next's): the wall-time gap between consecutive steps' loss events in TensorBoard (logged every step).
nemo, nemo_timer = [], []
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for f in glob.glob(f"{nemo_dir}/**/events.out.tfevents*", recursive=True):
    acc = EventAccumulator(f, size_guidance={"scalars": 0}); acc.Reload()
    tags = acc.Tags()["scalars"]
    if "reduced_train_loss" in tags:
        ends = sorted((e.step, e.wall_time) for e in acc.Scalars("reduced_train_loss"))
        nemo += [(s1, t1 - t0) for (s0, t0), (s1, t1) in zip(ends, ends[1:]) if s1 == s0 + 1]
    if "train_step_timing in s" in tags:  # NeMo's own timer, where a callback logs it
        nemo_timer += [e.value for e in acc.Scalars("train_step_timing in s")]
bridge = []
try:
    bridge = [(r["iteration"], r["step_time_s"]) for r in map(json.loads, open(bridge_metrics)) if "step_time_s" in r]
except FileNotFoundError:
    pass
def side(rows):
    timed = [t for s, t in sorted(rows) if s > WARM]
    return {"steps_timed": len(timed), "median_step_s": statistics.median(timed) if timed else None,
            "tokens_per_s": tokens / statistics.median(timed) if timed else None, "step_times_s": [t for _, t in sorted(rows)]}
summary = {"part": "qwen", "steps": [json.loads(l) for l in open(f"{logs}/steps.jsonl")], "tokens_per_step": tokens,
           "warmup_steps_skipped": WARM, "nemo2": side(nemo), "kaiyuan": side(bridge),
           "nemo2_train_step_timing_s": nemo_timer}
if summary["nemo2"]["tokens_per_s"] and summary["kaiyuan"]["tokens_per_s"]:
    summary["kaiyuan_over_nemo2"] = summary["kaiyuan"]["tokens_per_s"] / summary["nemo2"]["tokens_per_s"]
json.dump(summary, open(f"{logs}/summary.json", "w"), indent=1)
print(json.dumps({k: v for k, v in summary.items() if k != "steps"}, indent=1)[:3000])
PY
}

case $part in
  nemo)
    nemo2_setup || exit 1
    rm -rf "$nemo_dir"
    nvidia-smi > "$logs/nvidia-smi.txt" 2>&1
    nemo_pretrain nemo_train "kaiyuan_gpt_smoke(max_steps=$steps, dir='$nemo_dir')"; rc=$?
    nemo_summary nemo_train
    exit $rc ;;
  resume)
    if [ ! -d "$nemo_dir/kaiyuan_gpt_smoke/checkpoints" ]; then
      echo "nemo2_pretrain.sh: no checkpoints under $nemo_dir: --part nemo did not run on this machine (a fresh" \
        "machine after the last was given back?): run the env and nemo parts again first" >&2
      echo '{"part": "resume", "error": "no checkpoints from --part nemo on this machine"}' > "$logs/summary.json"
      exit 1
    fi
    nemo2_setup || exit 1
    ls "$nemo_dir/kaiyuan_gpt_smoke/checkpoints" > "$logs/checkpoints_before.txt"
    # The same factory (its schedule ends at --steps); only the trainer goes on, so resuming is what starts it.
    nemo_pretrain nemo_resume "kaiyuan_gpt_smoke(max_steps=$steps, dir='$nemo_dir')" \
      trainer.max_steps="$opt_resume_to"; rc=$?
    nemo_summary nemo_resume
    [ $rc -eq 0 ] || exit $rc
    # Item 3: the newest checkpoint's weights through NeMo's own loader (ModelConnector.nemo_load), for the export.
    rm -f "$weights"
    run_logged dump_weights "$opt_python" -m kaiyuan_recipes.nemo2.weights "$nemo_dir" "$weights"
    exit $? ;;
  kaiyuan)
    source tests/gpu/env.sh  # the Megatron-Bridge environment, and `kaiyuan`
    overrides=()
    for o in $FUSIONS_OFF; do overrides+=("model.$o=false"); done
    rm -rf "$runs/bridge_gpt_smoke"
    # foreach_grad_clip=false: upstream's clipping code on both sides.
    run_logged kaiyuan_train python3 -m kaiyuan_recipes.cli.main train gpt_smoke train.train_iters="$steps" kaiyuan.layer_spec=local \
      kaiyuan.foreach_grad_clip=false checkpoint.save_interval="$opt_save_every" "${overrides[@]}" \
      kaiyuan.run_root="$runs" kaiyuan.run_name=bridge_gpt_smoke; rc=$?
    cp "$runs/bridge_gpt_smoke/run_state/metrics.jsonl" "$logs/kaiyuan_metrics.jsonl" 2>/dev/null
    cp "$runs/bridge_gpt_smoke/run_config.yaml" "$logs/" 2>/dev/null
    python3 - "$logs" <<'PY'
import json, sys
logs = sys.argv[1]
try:
    rows = [json.loads(l) for l in open(f"{logs}/kaiyuan_metrics.jsonl") if '"loss"' in l]
except FileNotFoundError:
    rows = []
summary = {"part": "kaiyuan", "steps": [json.loads(l) for l in open(f"{logs}/steps.jsonl")],
           "loss_steps": [rows[0]["iteration"], rows[-1]["iteration"]] if rows else None,
           "first_loss": rows[0]["loss"] if rows else None, "last_loss": rows[-1]["loss"] if rows else None}
json.dump(summary, open(f"{logs}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
    exit $rc ;;
  export)
    source tests/gpu/env.sh
    : > "$logs/steps.jsonl"
    serve_nemo2_export; rc=$?
    python3 -c 'import json, sys; json.dump({"part": "export", "steps": [json.loads(l) for l in open(sys.argv[1])]},
      open(sys.argv[2], "w"), indent=1)' "$logs/steps.jsonl" "$logs/summary.json"
    exit $rc ;;
  qwen)
    nemo2_setup || exit 1
    nvidia-smi > "$logs/nvidia-smi.txt" 2>&1
    rm -rf "$runs/nemo2_qwen" "$runs/bridge_qwen3"
    # One validation batch at the end on both sides (the per-step timings leave it out); no checkpoint; the
    # recipe's schedule fitted to the steps.
    nemo_pretrain nemo_qwen "kaiyuan_qwen3(max_steps=$opt_qwen_steps, dir='$runs/nemo2_qwen', num_gpus_per_node=1, global_batch_size=$opt_qwen_batch, micro_batch_size=2)" \
      trainer.val_check_interval="$opt_qwen_steps" trainer.limit_val_batches=1 log.ckpt.every_n_train_steps=1000000 \
      log.ckpt.save_last=false
    # The Megatron-Bridge environment, not NeMo 2's.
    if [ -n "$bridge_pythonpath" ]; then export PYTHONPATH=$bridge_pythonpath; else unset PYTHONPATH; fi
    source tests/gpu/env.sh
    overrides=()
    for o in $FUSIONS_OFF; do overrides+=("model.$o=false"); done
    run_logged kaiyuan_qwen python3 -m kaiyuan_recipes.cli.main train \
      qwen3_1p7b train.train_iters="$opt_qwen_steps" train.global_batch_size="$opt_qwen_batch" train.micro_batch_size=2 \
      kaiyuan.layer_spec=local kaiyuan.foreach_grad_clip=false validation.eval_interval="$opt_qwen_steps" \
      validation.eval_iters=1 checkpoint.save_interval=1000000 checkpoint.save=null \
      "${overrides[@]}" kaiyuan.run_root="$runs" kaiyuan.run_name=bridge_qwen3
    cp "$runs/bridge_qwen3/run_state/metrics.jsonl" "$logs/kaiyuan_qwen_metrics.jsonl" 2>/dev/null
    qwen_summary
    exit 0 ;;
esac
