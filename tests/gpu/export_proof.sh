#!/usr/bin/env bash
# A trained run exported and checked on one CUDA GPU with the package installed, from the repository root:
#   bash tests/gpu/export_proof.sh --run RUN_DIR --name NAME
# `kaiyuan export hf` (timed) into /tmp/export/NAME, then Megatron-vs-HF logits on 32 prompts
# (tests/gpu/export_parity.py). Writes $out/NAME_export_time.txt and $out/NAME_parity.json.
set -euo pipefail
source tests/gpu/flags.sh
flag run "" "required: the trained run directory (or its checkpoints/ or an iter_* directory)"
flag name "" "required: the model's name in the file names (e.g. qwen3_1p7b)"
parse_flags "$@"
run=$opt_run name=$opt_name
source tests/gpu/env.sh
hf=/tmp/export/$name; rm -rf "$hf"; mkdir -p /tmp/export
start=$(date +%s.%N)
python3 -m kaiyuan_recipes.cli.main export hf "$run" "$hf" 2>&1 | tail -3
echo "export_seconds $(python3 -c "print(round($(date +%s.%N) - $start, 1))")" | tee "$out/${name}_export_time.txt"
ls -la "$hf"
python3 tests/gpu/export_parity.py "$run" "$hf" --name "$name" --out "$out/${name}_parity.json" \
  --command "bash tests/gpu/export_proof.sh --run $run --name $name" 2>&1 | grep -vE "Warning|warn" | tail -8
