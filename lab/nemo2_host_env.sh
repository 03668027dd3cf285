# The NeMo 2 set on the team's GPU host, beside the host's own torch (kept): sourced by lab/gpu.sh before a NeMo 2
# script (tests/gpu/nemo2_env.sh, nemo2_pretrain.sh) when --wheels names a set (`make -C lab gpu-wheels-nemo2`, staged
# in parts by stage.py and received into /tmp/stage/nemo2/files; .whl-nemo2 by default).
# lab_nemo2_setup WHEELS SITE PYTHON (SITE empty: /tmp/site-nemo2): checks WHEELS against lab/nemo2-wheels.txt, installs
# it into SITE once per set, makes the source tree's entry points (the `nemo_run.cli` factories) visible without
# installing the package, and sets nemo2_pythonpath to the tree, them and SITE in front of the host's packages (what
# lab/gpu.sh hands the script as --pythonpath: its NeMo 2 side's PYTHONPATH).
lab_nemo2_setup() {
  local wheels=$1 site=${2:-/tmp/site-nemo2} py=$3
  local marker=$site/.kaiyuan-nemo2-wheels
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
  "$py" lab/entry_points.py "$site-ep" > /dev/null || return 1
  nemo2_pythonpath="$PWD:$site-ep:$site${PYTHONPATH:+:$PYTHONPATH}"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there; the tokenizer is built from the package
  # The host has jax and flax, built against numpy 2: transformers 4.57 imports jax when flax is there, and that
  # aborts the process under the shipped numpy 1.26. Torch only.
  export USE_TORCH=1 USE_FLAX=0 USE_TF=0
}
