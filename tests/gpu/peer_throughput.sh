#!/usr/bin/env bash
# Our qwen3_1p7b training against the peers' own trainers (torchtitan, OLMo-core) on one GPU, through the device
# tool from the repo root. The peers' wheel sets (`make -C lab titan-wheels olmo-wheels`: .whl-titan 1.9 MB,
# .whl-olmo 21 MB) do not fit beside .whl in one call, so first a call that carries them (not .whl):
#   bash tests/gpu/peer_throughput.sh --install-only
# then, on the same warm machine, a call that carries .whl:
#   bash tests/gpu/peer_throughput.sh [--impls "ours torchtitan olmo_core"] [--impl-timeout 240]
# train_throughput.py's rows in one process, each row's training in a process of its own, in order: seq 4096, micro
# batch 2 x 4 micro-batches, 15 steps, the same token stream (token_stream.py); tokens/s, Megatron's model TFLOP/s,
# peak memory and every step's loss per row (the peer_*.py docstrings: the settings and what differs). Each set is
# installed into /tmp/site-<peer>, on the PYTHONPATH of the peers' processes only. Writes $out/peer_throughput.json
# and a log per peer row; $out/done holds the exit code (a detached run can be read by a later call).
set -uo pipefail
source tests/gpu/flags.sh
flag impls "ours torchtitan olmo_core" "train_throughput.py's rows, in order (also: torchtitan_untied)"
flag impl-timeout 240 "seconds per row; past it the row records a timeout and the next one runs"
flag steps 15 "training steps per row (the first 3 are not timed)"
flag peers "titan olmo" "the peer wheel sets: .whl-<peer> installed into /tmp/site-<peer>"
switch install-only "install the carried peer sets and stop"
parse_flags "$@"
source tests/gpu/env.sh
rm -f "$out/done"
sites=()
for peer in $opt_peers; do
  wheels=.whl-$peer site=/tmp/site-$peer
  if [ -d "$wheels" ] && [ "$(ls "$wheels")" != "$(cat "$site/.kaiyuan-wheels" 2>/dev/null)" ]; then
    rm -rf "$site"  # as env.sh: a changed set replaces the last one whole; the marker after a complete install
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl \
      && ls "$wheels" > "$site/.kaiyuan-wheels" || rm -rf "$site"
  fi
  [ -f "$site/.kaiyuan-wheels" ] || { echo "no $site: carry $wheels (make -C lab $peer-wheels)"; echo 2 > "$out/done"; exit 2; }
  echo "$site: $(wc -l < "$site/.kaiyuan-wheels") wheels"
  sites+=("$site")
done
[ "$opt_install_only" = 1 ] && { echo 0 > "$out/done"; exit 0; }
# shellcheck disable=SC2086  # a list of rows
python3 benchmarks/train_throughput.py --models qwen3_1p7b --impls $opt_impls --steps "$opt_steps" \
  --impl-timeout "$opt_impl_timeout" --peer-pythonpath "${sites[@]}" --out "$out/peer_throughput.json"
rc=$?
echo "$rc" > "$out/done"
exit "$rc"
