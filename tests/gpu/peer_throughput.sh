#!/usr/bin/env bash
# Our qwen3_1p7b training against the peers' own trainers (torchtitan, OLMo-core) on one CUDA GPU, with the package
# installed and each peer installed in a folder of its own (`pip install --target DIR torchtitan`, at the versions the
# peer_*.py docstrings name), which only the peers' processes put on their PYTHONPATH. From the
# repository root (about 15 minutes):
#   bash tests/gpu/peer_throughput.sh --peer-sites "DIR_TITAN DIR_OLMO" [--impls "ours torchtitan olmo_core"]
# train_throughput.py's rows in one process, each row's training in a process of its own, in order: seq 4096, micro
# batch 2 x 4 micro-batches, 15 steps, the same token stream (token_stream.py); tokens/s, Megatron's model TFLOP/s,
# peak memory and every step's loss per row (the peer_*.py docstrings: the settings and what differs). Writes
# --out/peer_throughput.json and a log per peer row; --out/done holds the exit code (readable while a background run
# goes on). --profile: `ours` and the peer rows go on two steps past the timed ones to one step under their own
# framework's PyTorch profiler (a minute or two more); the traces land beside the results, and
# peer_profile_report.py turns them into --out/peer_profile.json and .png (time per kernel family, GPU idle, launch
# counts, achieved TFLOP/s against --peak-tflops).
set -uo pipefail
source tests/gpu/flags.sh
flag impls "ours torchtitan olmo_core" "train_throughput.py's rows, in order (also: torchtitan_untied)"
flag impl-timeout 240 "seconds per row; past it the row records a timeout and the next one runs"
flag steps 15 "training steps per row (the first 3 are not timed)"
flag peer-sites "" "the folders the peers are installed in (required for the peer rows)"
switch profile "a profiler trace of one step after the timed ones for every row, and the report"
flag peak-tflops 790 "the GPU's dense bf16 matrix peak the report measures against"
parse_flags "$@"
source tests/gpu/env.sh
rm -f "$out/done"
read -ra sites <<< "$opt_peer_sites"
profile=(); [ "$opt_profile" = 1 ] && profile=(--profile)
# shellcheck disable=SC2086  # a list of rows
python3 benchmarks/train_throughput.py --models qwen3_1p7b --impls $opt_impls --steps "$opt_steps" \
  --impl-timeout "$opt_impl_timeout" ${sites[@]:+--peer-pythonpath "${sites[@]}"} --out "$out/peer_throughput.json" \
  ${profile[@]:+"${profile[@]}"}
rc=$?
if [ "$opt_profile" = 1 ] && [ -f "$out/peer_throughput.json" ]; then
  python3 benchmarks/peer_profile_report.py --results "$out/peer_throughput.json" --peak-tflops "$opt_peak_tflops" \
    --out "$out/peer_profile.json" || { [ "$rc" = 0 ] && rc=1; }
fi
echo "$rc" > "$out/done"
exit "$rc"
