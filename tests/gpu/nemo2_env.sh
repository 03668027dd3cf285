#!/usr/bin/env bash
# The NeMo 2 side of the GPU scripts: an interpreter whose environment has the `nemo2` extra (`make env-nemo2`
# builds .venv-nemo2; pass --python .venv-nemo2/bin/python), and `nemo`, NeMo-Run's CLI through it. Run it to check
# that environment (prints the versions in use and the head of `nemo llm pretrain --factory kaiyuan_gpt_smoke
# --dryrun`; a minute, no GPU needed):
#   bash tests/gpu/nemo2_env.sh --python .venv-nemo2/bin/python
# or source it from a script, which declares the flags and then calls nemo2_setup (nemo2_pretrain.sh does):
#   source tests/gpu/flags.sh; source tests/gpu/nemo2_env.sh; nemo2_flags; parse_flags "$@"; nemo2_setup || exit 1
# Nothing is installed: --pythonpath names the NeMo 2 side's PYTHONPATH where its interpreter lacks a package (a
# folder it was installed into); the Megatron-Bridge side keeps the PYTHONPATH the script was given
# ($bridge_pythonpath).

nemo2_flags() {
  flag python python3 "the interpreter of the NeMo 2 environment (e.g. .venv-nemo2/bin/python)"
  flag pythonpath "" "the NeMo 2 side's PYTHONPATH, in place of the one the script is given (kept for the Bridge side)"
}

nemo2_setup() {
  out=$opt_out; mkdir -p "$out"
  bridge_pythonpath=${bridge_pythonpath-${PYTHONPATH:-}}
  [ -z "$opt_pythonpath" ] || export PYTHONPATH=$opt_pythonpath
  export PYTHONUNBUFFERED=1
  # megatron-core 0.15 JIT-builds a CUDA allocator at import (inference/unified_memory.py). A build killed midway
  # (a time limit) leaves its lock file, and every later import then waits on it for ever: a folder of our own,
  # and no lock survives into the next script (these scripts run one at a time).
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch-ext-nemo2}
  find "$TORCH_EXTENSIONS_DIR" -name lock -delete 2> /dev/null
  # No GPU (the check on a CPU host): name an arch, as .venv-nemo2's .pth does (kaiyuan_recipes.compat.cpu_cuda_arch_list).
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
