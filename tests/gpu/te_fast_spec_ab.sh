#!/usr/bin/env bash
# The fast spec with Transformer Engine importable against TE hidden (docs/te.md, "What the next person should
# measure"), on one CUDA GPU with the package installed and Transformer Engine in a folder of its own (--te-site,
# e.g. `pip install --target DIR`), so that it can be left off the path. From the repository root (~15 minutes):
#   bash tests/gpu/te_fast_spec_ab.sh --te-site DIR [--variants "without_te with_te"] [--extra "..."]
# For each variant, profile_fast_spec.sh (qwen3_1p7b, seq 4096, micro batch 2 x 4; a trace of step 7 summarised
# by kernel family) with PYTHONPATH with or without --te-site; then train_throughput.py's ours and
# ours_without_te rows in one process. Every result lands in --out as it is written, so a run in the background
# can be read while it goes on; `done` holds the exit code at the end.
set -uo pipefail
source tests/gpu/flags.sh
flag te-site "${KAIYUAN_TE_SITE:-}" "required: the folder TE is installed in"
flag variants "without_te with_te" "which profiles to take, in order"
flag extra "" "more overrides for every profile, space-separated"
flag throughput 1 "1: also the ours / ours_without_te rows of train_throughput.py"
parse_flags "$@"
out=$opt_out; mkdir -p "$out"; rm -f "$out/done"
base_path=${PYTHONPATH:-}
rc=0
for variant in $opt_variants; do
  case $variant in
    with_te) PYTHONPATH="$opt_te_site${base_path:+:$base_path}" ;;
    without_te) PYTHONPATH=$base_path ;;
    *) echo "unknown variant $variant (with_te, without_te)"; echo 2 > "$out/done"; exit 2 ;;
  esac
  export PYTHONPATH
  mkdir -p "$out/$variant"
  echo "== profile $variant ($(date +%T))"
  bash tests/gpu/profile_fast_spec.sh --out "$out/$variant" --extra "$opt_extra" > "$out/$variant/profile.out" 2>&1 \
    || { rc=1; tail -20 "$out/$variant/profile.out"; }
  grep -E "iteration +[0-9]+/" "$out/$variant/profile_train.log" | tail -8 > "$out/$variant/iterations.txt" || true
done
if [ "$opt_throughput" = 1 ]; then
  export PYTHONPATH="$opt_te_site${base_path:+:$base_path}"
  source tests/gpu/env.sh
  echo "== throughput ($(date +%T))"
  python3 benchmarks/train_throughput.py --models qwen3_1p7b --impls ours ours_without_te --impl-timeout 300 \
    --out "$out/te_fast_spec_ab_throughput.json" > "$out/throughput.out" 2>&1 || { rc=1; tail -20 "$out/throughput.out"; }
fi
echo "$rc" > "$out/done"
exit "$rc"
