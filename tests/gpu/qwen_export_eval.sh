#!/usr/bin/env bash
# Export and held-out eval of a trained qwen3_1p7b on one CUDA GPU with the package installed, from the repository
# root (~10 minutes):
#   bash tests/gpu/qwen_export_eval.sh
# qwen3_1p7b trained for 10 steps (any quality), its torch_dist checkpoint exported with `kaiyuan export hf`,
# Megatron-vs-HF parity on 32 prompts, then `kaiyuan eval heldout` on a held-out file of the real shape
# (7 dimensions x 8). Then the same export + parity for gpt_smoke (20 steps).
set -euo pipefail
source tests/gpu/flags.sh
parse_flags "$@"
source tests/gpu/env.sh
root=/tmp/proof_runs
short=(kaiyuan.run_root=$root train.global_batch_size=8 logger.log_interval=1 scheduler.lr_warmup_iters=3
       scheduler.lr_wsd_decay_iters=3 checkpoint.save_optim=false checkpoint.save_rng=false)
kaiyuan train qwen3_1p7b "${short[@]}" train.train_iters=10 checkpoint.save_interval=10 > "$out/qwen_train.log" 2>&1
grep -E "iteration +10/|saved checkpoint" "$out/qwen_train.log" | tail -2
bash tests/gpu/export_proof.sh --run $root/qwen3_1p7b --name qwen3_1p7b --out "$out"
python3 - <<'PY'
import json
from kaiyuan_recipes.data.heldout import DIMENSIONS
with open("/tmp/heldout.jsonl", "w", encoding="utf-8") as fh:
    for dim in DIMENSIONS:
        for i in range(8):
            row = {"dimension": dim, "prompt": f"[{dim} #{i}] 问题：{i}+{i}=?\n答：", "completion": f" {2 * i}"}
            if i % 2 == 0:
                row |= {"choices": [f" {2 * i}", f" {2 * i + 1}", " 0"], "answer": 0}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
PY
kaiyuan eval heldout --model /tmp/export/qwen3_1p7b --data /tmp/heldout.jsonl --out "$out/eval_qwen3_1p7b" --device cuda 2>&1 | tail -12
timeout 240 python3 -m kaiyuan_recipes.cli.main train gpt_smoke "${short[@]}" train.train_iters=20 checkpoint.save_interval=20 > "$out/smoke_train.log" 2>&1 \
  && timeout 150 bash tests/gpu/export_proof.sh --run $root/gpt_smoke --name gpt_smoke --out "$out" || echo "gpt_smoke part did not finish"
