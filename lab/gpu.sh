#!/usr/bin/env bash
# A tests/gpu script the way the team's GPU host runs it, from the repository root:
#   bash lab/gpu.sh tests/gpu/SCRIPT.sh [FLAGS]
# Results go to $OUT (the folder the team's device tool collects; /tmp/out without it) unless FLAGS name another
# --out; tests/gpu/env.sh installs the wheel set .whl (KAIYUAN_LAB_WHEELS) through lab/gpu_host_env.sh; the NeMo 2
# scripts take .whl-nemo2 (KAIYUAN_LAB_NEMO2_WHEELS) and the TE scripts /tmp/site-te (KAIYUAN_TE_SITE, built by
# lab/te_env.sh) by default. Each can be set beforehand to name another folder.
set -u
script=${1:?usage: bash lab/gpu.sh tests/gpu/SCRIPT.sh [FLAGS]}; shift
export KAIYUAN_LAB_WHEELS=${KAIYUAN_LAB_WHEELS:-.whl} KAIYUAN_LAB_NEMO2_WHEELS=${KAIYUAN_LAB_NEMO2_WHEELS:-.whl-nemo2} \
  KAIYUAN_TE_SITE=${KAIYUAN_TE_SITE:-/tmp/site-te}
exec bash "$script" --out "${OUT:-/tmp/out}" "$@"
