#!/usr/bin/env bash
# A tests/gpu script the way the team's GPU host runs it, from the repository root:
#   bash lab/gpu.sh tests/gpu/SCRIPT.sh [FLAGS]
# For a tests/gpu script the host's environment is set up here, before the script runs; the script only uses the
# PYTHONPATH and flags it is given (lab/README.md):
# - lab/gpu_host_env.sh installs the wheel set .whl (KAIYUAN_LAB_WHEELS) and puts the tree and it first on
#   PYTHONPATH (FLAGS --stack fw2606: .whl-fw2606; FLAGS --dry-run: no install);
# - the NeMo 2 scripts' parts that train with NeMo 2 get .whl-nemo2 (KAIYUAN_LAB_NEMO2_WHEELS, or FLAGS --wheels DIR
#   [--site DIR]) installed by lab/nemo2_host_env.sh and handed over as --pythonpath;
# - peer_throughput.sh gets the peer sets (FLAGS --peers "titan olmo", --install-only) installed by lab_peer_sites and
#   handed over as --peer-sites.
# Results go to $OUT (the folder the team's device tool collects; /tmp/out without it) unless FLAGS name another
# --out. The TE scripts take /tmp/site-te (KAIYUAN_TE_SITE, built by lab/te_env.sh) by default. Each variable can be
# set beforehand to name another folder.
set -u
lab_script=${1:?usage: bash lab/gpu.sh tests/gpu/SCRIPT.sh [FLAGS]}; shift
export KAIYUAN_TE_SITE=${KAIYUAN_TE_SITE:-/tmp/site-te}
args=("$@")

flag_value() {  # flag_value NAME: the value FLAGS give --NAME last (as parse_flags reads it); status 1 when absent
  local i found=1
  for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
      "--$1") lab_value=${args[i + 1]:-} found=0; i=$((i + 1)) ;;
      "--$1="*) lab_value=${args[i]#*=} found=0 ;;
    esac
  done
  return $found
}
has_switch() { local a; for a in ${args[@]+"${args[@]}"}; do [ "$a" = "--$1" ] && return 0; done; return 1; }
drop_flag() {  # drop_flag NAME [switch]: FLAGS without --NAME (and its value, unless a switch)
  local i kept=()
  for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
      "--$1") [ "${2:-}" = switch ] || i=$((i + 1)) ;;
      "--$1="*) ;;
      *) kept+=("${args[i]}") ;;
    esac
  done
  args=(${kept[@]+"${kept[@]}"})
}

run_script() { exec bash "$lab_script" --out "${OUT:-/tmp/out}" ${args[@]+"${args[@]}"}; }
for arg in ${args[@]+"${args[@]}"}; do case $arg in --help|-h) run_script ;; esac; done  # --help sets nothing up
case $lab_script in tests/gpu/*|./tests/gpu/*) ;; *) run_script ;; esac  # a lab/ script (te_env.sh) sets up its own

# NeMo 2: the parts that call nemo2_setup (nemo2_env.sh itself; nemo2_pretrain.sh's nemo, resume and qwen) train
# with the NeMo 2 set; the others (and the qwen part's second half) with .whl, from the PYTHONPATH set below.
case ${lab_script##*/} in
  nemo2_env.sh|nemo2_pretrain.sh)
    nemo2_wheels=${KAIYUAN_LAB_NEMO2_WHEELS:-.whl-nemo2} nemo2_site= nemo2_python=python3 nemo2_part=
    flag_value wheels && nemo2_wheels=$lab_value
    flag_value site && nemo2_site=$lab_value
    flag_value python && nemo2_python=$lab_value
    flag_value part && nemo2_part=$lab_value
    drop_flag wheels; drop_flag site
    if [ -n "$nemo2_wheels" ] && { [ "${lab_script##*/}" = nemo2_env.sh ] || [[ $nemo2_part =~ ^(nemo|resume|qwen)$ ]]; }; then
      source lab/nemo2_host_env.sh && lab_nemo2_setup "$nemo2_wheels" "$nemo2_site" "$nemo2_python" || exit 1
      args+=(--pythonpath "$nemo2_pythonpath")
    fi ;;
esac

flag_value stack && [ "$lab_value" = fw2606 ] && lab_stack=fw2606
has_switch dry-run && opt_dry_run=1
source lab/gpu_host_env.sh

if [ "${lab_script##*/}" = peer_throughput.sh ]; then
  # A missing peer set fails an install-only run; a measuring run goes on, so that a peer without its set records
  # its import error in its row and the other rows are still measured.
  peers="titan olmo" sites=()
  flag_value peers && peers=$lab_value
  flag_value peer-sites && read -ra sites <<< "$lab_value"
  install_only=0; has_switch install-only && install_only=1
  drop_flag peers; drop_flag peer-sites; drop_flag install-only switch
  flag_value out && out=$lab_value || out=${OUT:-/tmp/out}
  mkdir -p "$out"; rm -f "$out/done"
  # shellcheck disable=SC2086  # a list of peers
  lab_peer_sites $peers; rc=$?
  if [ "$install_only" = 1 ]; then echo "$rc" > "$out/done"; exit "$rc"; fi
  args+=(--peer-sites "${sites[*]}")
fi
run_script
