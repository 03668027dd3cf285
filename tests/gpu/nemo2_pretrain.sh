#!/usr/bin/env bash
# Issue #33 item 2 on the GPU host: `nemo llm pretrain --factory "kaiyuan_gpt_smoke(max_steps=100)" -y` on the bundled
# sample corpus with the bundled tokenizer (checkpoints every --save-every steps, keep-K, TensorBoard), a restart that
# resumes, and `kaiyuan train gpt_smoke` for the same 100 steps (same data, seed, batch, schedule; the local spec and
# no fusions on both sides, so the kernels are comparable). One part per device call, back to back (each part
# reads the previous one's /tmp/nemo2_pretrain; a machine given back in between is reported, not papered over):
#   bash tests/gpu/nemo2_env.sh --wheels DIR                 # install the NeMo 2 set (staged DIR), dry run
#   bash tests/gpu/nemo2_pretrain.sh --wheels DIR --part nemo      # 100 steps
#   bash tests/gpu/nemo2_pretrain.sh --wheels DIR --part resume    # restart: resumes at 100, on to --resume-to
#   bash tests/gpu/nemo2_pretrain.sh --part kaiyuan                # Megatron-Bridge side; carry .whl (make gpu-wheels)
# Results under --out: nemo2_PART.tgz (every log, the loss curve as JSON lines, the checkpoints kept) and
# nemo2_PART.json (the summary). Not run yet: written on a CPU host, which checks the NeMo side's overrides
# (--dryrun) and the Bridge side's (kaiyuan train --dry-run) only.
set -uo pipefail
source tests/gpu/flags.sh
source tests/gpu/nemo2_env.sh
nemo2_flags
flag part "" "required: nemo, resume or kaiyuan"
flag steps 100 "training steps (both sides; the schedule is the recipe's, fitted to them)"
flag save-every 20 "checkpoint interval (more saves than keep-K's 3, so that pruning shows)"
flag resume-to 110 "resume: train on from the last checkpoint to this step"
flag timeout 480 "seconds each training command may take (the call's limit is 600)"
parse_flags "$@"
case $opt_part in nemo|resume|kaiyuan) ;; *) echo "nemo2_pretrain.sh: --part nemo|resume|kaiyuan, not '$opt_part'" >&2; exit 2 ;; esac
part=$opt_part steps=$opt_steps
root=/tmp/nemo2_pretrain; runs=$root/runs; logs=$root/logs_$part
out=${opt_out:-${OUT:-/tmp/out}}; mkdir -p "$out"
rm -rf "$logs"; mkdir -p "$logs"
trap 'tar czf "$out/nemo2_$part.tgz" -C "$root" "logs_$part"; cp "$logs/summary.json" "$out/nemo2_$part.json" 2>/dev/null' EXIT
trap 'exit 143' TERM
# Both sides tokenize the sample corpus into the same cache, so they read the same files.
export KAIYUAN_CACHE=$root/cache
# The fusions that need TE or Apex, off on both sides (the local spec turns masked softmax off on the Bridge side too).
FUSIONS_OFF="masked_softmax_fusion cross_entropy_loss_fusion gradient_accumulation_fusion bias_activation_fusion
  bias_dropout_fusion apply_rope_fusion"
nemo_dir=$runs/nemo2

run_logged() {  # run_logged NAME CMD...: CMD (a program, not a function) under --timeout, its output in $logs/NAME.log
  local name=$1; shift
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=30 "$opt_timeout" "$@" > "$logs/$name.log" 2>&1; local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"wall_s\": $((SECONDS - t0))}" >> "$logs/steps.jsonl"
  echo "[$name] rc=$rc $((SECONDS - t0))s"; tail -5 "$logs/$name.log"
  return $rc
}

nemo_pretrain() {  # nemo_pretrain NAME [OVERRIDE...]: the issue's command, into $nemo_dir
  local name=$1; shift
  local o overrides=()
  for o in $FUSIONS_OFF; do overrides+=("model.config.$o=false"); done
  # trainer.log_every_n_steps=1: a loss per step in TensorBoard, for the curve. ckpt_async_save=false: the recipe's
  # checkpoint.async_save, and what the Bridge side does.
  run_logged "$name" "$opt_python" -c "$NEMO_CLI" llm pretrain --factory "kaiyuan_gpt_smoke(max_steps=$steps, dir='$nemo_dir')" \
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

case $part in
  nemo)
    nemo2_setup || exit 1
    rm -rf "$nemo_dir"
    nvidia-smi > "$logs/nvidia-smi.txt" 2>&1
    nemo_pretrain nemo_train; rc=$?
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
    nemo_pretrain nemo_resume trainer.max_steps="$opt_resume_to"; rc=$?
    nemo_summary nemo_resume
    exit $rc ;;
  kaiyuan)
    source tests/gpu/env.sh  # the Megatron-Bridge set from .whl into /tmp/site, and `kaiyuan`
    overrides=()
    for o in $FUSIONS_OFF; do overrides+=("model.$o=false"); done
    rm -rf "$runs/bridge_gpt_smoke"
    # foreach_grad_clip=false: upstream's clipping code on both sides.
    run_logged kaiyuan_train "$opt_python" -m kaiyuan_recipes.cli.main train gpt_smoke train.train_iters="$steps" kaiyuan.layer_spec=local \
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
esac
