#!/usr/bin/env bash
# The NeMo 2 environment on the GPU host, beside the host's own torch 2.11 (kept): installs the wheel set of
# `make -C lab gpu-wheels-nemo2` (lab/nemo2-wheels.txt; ~260 MB, so it is staged in parts) into --site once per set,
# makes this package's entry points (the `nemo_run.cli` factories) visible from the source tree, puts both in
# front of the host's packages on PYTHONPATH, and defines `nemo`. Run it to check the environment:
#   bash tests/gpu/nemo2_env.sh --wheels DIR    # install, print the versions and the head of a factory dry run
# or source it from a script, which declares the flags and then calls nemo2_setup (nemo2_pretrain.sh does):
#   source tests/gpu/flags.sh; source tests/gpu/nemo2_env.sh; nemo2_flags; parse_flags "$@"; nemo2_setup || exit 1
# It also runs on a CPU host (the check before GPU time): --python a venv with torch 2.11, --site a scratch folder.

nemo2_flags() {
  flag wheels .whl-nemo2 "the NeMo 2 wheel set (make -C lab gpu-wheels-nemo2, or the folder it was staged into)"
  flag site /tmp/site-nemo2 "the install target, in front of the host's packages on PYTHONPATH"
  flag python python3 "the interpreter (the host's, with its torch)"
}

nemo2_setup() {
  out=${opt_out:-${OUT:-/tmp/out}}; mkdir -p "$out"
  local wheels=$opt_wheels site=$opt_site py=$opt_python marker=$opt_site/.kaiyuan-nemo2-wheels
  if [ ! -d "$wheels" ]; then
    echo "nemo2_env: no wheel folder '$wheels' (make -C lab gpu-wheels-nemo2 on a CPU host, then carry or stage it)" >&2
    return 1
  fi
  "$py" lab/nemo2_wheels.py check-dir "$wheels" || return 1
  if [ "$(ls "$wheels")" != "$(cat "$marker" 2>/dev/null)" ]; then
    echo "nemo2_env: installing $(ls "$wheels" | wc -l) wheels into $site"
    rm -rf "$site"  # a package left from another set would shadow the host's
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl \
      || { rm -rf "$site"; return 1; }
    ls "$wheels" > "$marker"
  fi
  # Entry points need a dist-info; the package itself runs from the source tree.
  "$py" tests/gpu/entry_points.py "$site-ep" > /dev/null || return 1
  export PYTHONPATH="$PWD:$site-ep:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there; the tokenizer is built from the package
  # The host has jax and flax, built against numpy 2: transformers 4.57 imports jax when flax is there, and that
  # aborts the process under the shipped numpy 1.26. Torch only.
  export USE_TORCH=1 USE_FLAX=0 USE_TF=0
  # megatron-core 0.15 JIT-builds a CUDA allocator at import (inference/unified_memory.py). A build killed midway
  # (a call's time limit) leaves its lock file, and every later import then waits on it for ever: a folder of our
  # own, and no lock survives into a new call (these scripts run one at a time).
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch-ext-nemo2}
  find "$TORCH_EXTENSIONS_DIR" -name lock -delete 2> /dev/null
  # No GPU (the CPU check): name an arch, as .venv-nemo2's .pth does (kaiyuan_recipes.compat.cpu_cuda_arch_list).
  [ -e /proc/driver/nvidia/version ] || export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  return 0
}

# The `nemo` console script of nemo-run, without depending on the shebang pip wrote: "$opt_python" -c "$NEMO_CLI" ARGS.
NEMO_CLI='import sys; from nemo_run.__main__ import app; sys.argv[0] = "nemo"; sys.exit(app())'
nemo() { "$opt_python" -c "$NEMO_CLI" "$@"; }

nemo2_report() {  # the versions in use (and where from), then the head of the factory's dry run
  "$opt_python" - 2> "$out/nemo2_versions.err" <<'PY'
import importlib.metadata as md
for dist, module in [("torch", "torch"), ("nemo-toolkit", "nemo"), ("megatron-core", "megatron.core"),
                     ("lightning", "lightning"), ("transformers", "transformers"), ("tokenizers", "tokenizers"),
                     ("numpy", "numpy"), ("nemo-run", "nemo_run")]:
    mod = __import__(module, fromlist=["_"])
    print(f"{dist:14} {md.version(dist):16} {mod.__file__.split('/' + module.split('.')[0] + '/')[0]}")
PY
  local rc
  nemo llm pretrain --factory kaiyuan_gpt_smoke --dryrun > "$out/nemo2_dryrun.log" 2>&1; rc=$?
  sed -n '/^Dry run for task/,$p' "$out/nemo2_dryrun.log" | head -40
  echo "nemo llm pretrain --factory kaiyuan_gpt_smoke --dryrun: exit $rc (whole output: $out/nemo2_dryrun.log)"
  [ $rc -eq 0 ] || tail -5 "$out/nemo2_dryrun.log"
  return $rc
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  source tests/gpu/flags.sh
  nemo2_flags
  parse_flags "$@"
  nemo2_setup || exit 1
  nemo2_report
fi
