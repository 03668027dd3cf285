#!/usr/bin/env bash
# Our qwen3_1p7b training against torchtitan's own trainer on one GPU, through the device tool from the repo root
# (.whl and .whl-titan carried: `make -C lab gpu-wheels titan-wheels`):
#   bash tests/gpu/peer_throughput.sh [--impls "ours torchtitan_untied torchtitan"] [--impl-timeout 300]
# train_throughput.py's rows in one process, each row's training in a process of its own, in order: seq 4096, micro
# batch 2 x 4 micro-batches, 15 steps, the same token stream (token_stream.py); tokens/s, Megatron's model TFLOP/s,
# peak memory and every step's loss per row (peer_torchtitan.py's docstring: the settings and what differs).
# .whl-titan is installed into --peer-site, on the PYTHONPATH of the peer's processes only. Writes
# $out/peer_throughput.json; $out/done holds the exit code (a detached run can be read by a later call).
set -uo pipefail
source tests/gpu/flags.sh
flag impls "ours torchtitan_untied torchtitan" "train_throughput.py's rows, in order"
flag impl-timeout 300 "seconds per row; past it the row records a timeout and the next one runs"
flag steps 15 "training steps per row (the first 3 are not timed)"
flag peer-wheels .whl-titan "the peer's wheel set (lab/titan-wheels.txt)"
flag peer-site /tmp/site-titan "where the peer's wheels are installed"
parse_flags "$@"
source tests/gpu/env.sh
rm -f "$out/done"
if [ -d "$opt_peer_wheels" ] && [ "$(ls "$opt_peer_wheels")" != "$(cat "$opt_peer_site/.kaiyuan-wheels" 2>/dev/null)" ]; then
  rm -rf "$opt_peer_site"  # as env.sh: a changed set replaces the last one whole; the marker after a complete install
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$opt_peer_site" \
    "$opt_peer_wheels"/*.whl && ls "$opt_peer_wheels" > "$opt_peer_site/.kaiyuan-wheels" || rm -rf "$opt_peer_site"
fi
[ -d "$opt_peer_site" ] || { echo "no $opt_peer_site: carry $opt_peer_wheels (make -C lab titan-wheels)"; echo 2 > "$out/done"; exit 2; }
# shellcheck disable=SC2086  # a list of rows
python3 benchmarks/train_throughput.py --models qwen3_1p7b --impls $opt_impls --steps "$opt_steps" \
  --impl-timeout "$opt_impl_timeout" --peer-pythonpath "$opt_peer_site" --out "$out/peer_throughput.json"
rc=$?
echo "$rc" > "$out/done"
exit "$rc"
