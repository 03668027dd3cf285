#!/usr/bin/env bash
# A multi-phase curriculum on one CUDA GPU with the package installed, from the repository root (~10 minutes):
#   bash tests/gpu/curriculum_proof.sh --rev $(git rev-parse --short HEAD)
# A three-phase gpt_smoke curriculum on the bundled corpus: phase 1 English (shuffled), phase 2 English + Chinese
# ordered by a synthetic rank column (a seeded permutation of the rows, so stored order and rank order differ),
# phase 3 both shuffled (decay). Phase 2 is started detached, stopped with `kaiyuan stop` inside the phase and
# restarted; phase 3 follows; then `kaiyuan average` of the last 3 checkpoints and `kaiyuan export hf` of the mean.
# The report reads the run's own artifacts (the ordered indices the training wrote, its logs, its checkpoints):
# $out/curriculum.json. On a CPU host: --dry-run resolves the three launches.
set -euo pipefail
source tests/gpu/flags.sh
switch dry-run "resolve the launches (kaiyuan train --dry-run), train nothing; no wheel install"
flag python python3 "the Python that runs kaiyuan and the report"
flag work /tmp/curriculum_proof "scratch directory (emptied first)"
flag rev "" "required: the git revision of the tree (recorded in the result)"
flag stop-at 33 "the iteration inside phase 2 (iterations 21-50) after which kaiyuan stop is sent"
parse_flags "$@"
source tests/gpu/env.sh
py=$opt_python work=$opt_work
rm -rf "$work"; mkdir -p "$work/in1" "$work/inen" "$work/inzh" "$work/in3"
"$py" - "$work" <<'PY'
import random, sys
import pyarrow as pa, pyarrow.parquet as pq
from kaiyuan_recipes.data.sample_corpus import CORPUS_DIR
work = sys.argv[1]
for name, seed in (("en_jargon", 1), ("zh_poems", 2)):
    table = pq.read_table(CORPUS_DIR / f"{name}.parquet")
    ranks = list(range(table.num_rows)); random.Random(seed).shuffle(ranks)
    short = name.split("_")[0]
    pq.write_table(table.append_column("rank", pa.array([float(r) for r in ranks])), f"{work}/in{short}/{name}.parquet")
    pq.write_table(table, f"{work}/in3/{name}.parquet")
pq.write_table(pq.read_table(CORPUS_DIR / "en_jargon.parquet"), f"{work}/in1/en_jargon.parquet")
PY
for src in 1 en zh 3; do
  kaiyuan data convert --input-dir "$work/in$src" --output-dir "$work/data$src" --output-prefix "d$src" --num-shards 1 \
    > "$out/convert_$src.log" 2>&1 || { cat "$out/convert_$src.log"; exit 1; }
done
# 20 + 30 + 15 steps of 8 x 4096 tokens; saves every 5 iterations; kaiyuan.average_last keeps the last 3.
cat > "$work/three_phases.yaml" <<YAML
seq_length: 4096
global_batch_size: 8
phases:
  1: {tokens: 655360, order: shuffled, sources: [{name: en, dir: $work/data1, weight: tokens}]}
  2: {tokens: 983040, order: by_rank, sources: [{name: en, dir: $work/dataen, weight: tokens},
                                                {name: zh, dir: $work/datazh, weight: tokens}]}
  3: {tokens: 491520, order: shuffled, sources: [{name: both, dir: $work/data3, weight: tokens}]}
YAML
# The recipe defaults otherwise (the fast path where the GPU has it); the tokenizer the data was converted with.
tok=$("$py" -c "from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir; print(default_tokenizer_dir())")
common=(kaiyuan.run_root="$work/runs" kaiyuan.tokenizer="$tok" kaiyuan.data=curriculum kaiyuan.curriculum="$work/three_phases.yaml"
        kaiyuan.average_last=3 train.global_batch_size=8 train.micro_batch_size=2
        scheduler.lr_warmup_iters=5 logger.log_interval=1 checkpoint.save_interval=5)
args=("${common[@]}" kaiyuan.run_name=cur)
if [ "$opt_dry_run" = 1 ]; then
  for n in 1 2 3; do kaiyuan train gpt_smoke --phase $n "${args[@]}" --dry-run --json > "$out/dry_phase$n.json"; done
  exit 0
fi
trap 'kaiyuan stacks cur --run-root "$work/runs" > "$out/stacks.txt" 2>&1 || true; cp -r "$work/runs/cur/logs" "$out/run_logs" 2>/dev/null || true' EXIT
kaiyuan train gpt_smoke --phase 1 "${args[@]}" > "$out/phase1.log" 2>&1 || { tail -40 "$out/phase1.log"; exit 1; }
kaiyuan start gpt_smoke cur "${common[@]}" kaiyuan.phase=2
deadline=$((SECONDS + 300))
while :; do
  rc=0; "$py" - "$work/runs/cur" "$opt_stop_at" <<'PY' 2>/dev/null || rc=$?
import sys
from pathlib import Path
from kaiyuan_recipes.launch.backends import open_run
from kaiyuan_recipes.config.run_layout import read_metrics
run = Path(sys.argv[1])
steps = [r for r in read_metrics(run / "run_state") if r.get("event") == "step"]
if steps and steps[-1]["iteration"] >= int(sys.argv[2]):
    sys.exit(0)
sys.exit(3 if open_run(run).status()["state"] in ("failed", "finished", "stopped") else 1)
PY
  [ $rc = 0 ] && break
  if [ $rc = 3 ] || [ $SECONDS -gt $deadline ]; then
    echo "phase 2 did not reach iteration $opt_stop_at"; kaiyuan status cur --run-root "$work/runs"; exit 1
  fi
  sleep 0.5
done
kaiyuan stop cur --run-root "$work/runs" --grace 240 > "$out/stop.json"
kaiyuan logs cur --run-root "$work/runs" > "$out/phase2_before_stop.log"
kaiyuan start gpt_smoke cur "${common[@]}" kaiyuan.phase=2
deadline=$((SECONDS + 300))
while kaiyuan status cur --run-root "$work/runs" | grep -q '"state": "running"'; do
  [ $SECONDS -gt $deadline ] && { echo "resumed phase 2 did not finish"; exit 1; }
  sleep 2
done
kaiyuan logs cur --run-root "$work/runs" > "$out/phase2_after_resume.log"
kaiyuan status cur --run-root "$work/runs" > "$out/phase2_status.json"
kaiyuan train gpt_smoke --phase 3 "${args[@]}" > "$out/phase3.log" 2>&1 || { tail -40 "$out/phase3.log"; exit 1; }
kaiyuan ckpt ls "$work/runs/cur" --json > "$out/ckpt_ls.json"
kaiyuan average "$work/runs/cur" "$work/avg" --last 3 --json > "$out/average.json" 2> "$out/average.log"
kaiyuan export hf "$work/avg" "$work/avg_hf" > "$out/export.log" 2>&1 || { tail -30 "$out/export.log"; exit 1; }
"$py" tests/gpu/curriculum_report.py --work "$work" --logs "$out" --rev "$opt_rev" --out "$out/curriculum.json" \
  --command "bash tests/gpu/curriculum_proof.sh --rev $opt_rev --stop-at $opt_stop_at"
