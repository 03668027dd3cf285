#!/usr/bin/env bash
# GPU proof for [export] §3 from a trained run, through the device tool from the repo root:
#   bash tests/gpu/export_proof.sh RUN_DIR NAME
# `kaiyuan export hf` (timed), then Megatron-vs-HF logits on 32 prompts (tests/gpu/export_parity.py).
set -euo pipefail
run=${1:?run dir}; name=${2:?model name}
source tests/gpu/env.sh
hf=/tmp/export/$name; rm -rf "$hf"; mkdir -p /tmp/export
start=$(date +%s.%N)
python3 -m kaiyuan_recipes.cli.main export hf "$run" "$hf" 2>&1 | tail -3
echo "export_seconds $(python3 -c "print(round($(date +%s.%N) - $start, 1))")" | tee "$out/${name}_export_time.txt"
ls -la "$hf"
python3 tests/gpu/export_parity.py "$run" "$hf" --name "$name" --out "$out/${name}_parity.json" \
  --command "bash tests/gpu/export_proof.sh $run $name" 2>&1 | grep -vE "Warning|warn" | tail -8
