#!/usr/bin/env bash
# The Transformer Engine path on a CUDA GPU where TE imports (from the environment, or from a folder of its own named
# by --te-site), with the package installed. From the repository root (about 10-20 minutes for the default parts):
#   bash tests/gpu/te_proof.sh [--parts "dry-run stop-resume export"]
# dry-run:     `kaiyuan train gpt_smoke --dry-run` and `kaiyuan doctor` on the defaults: `auto` picks TE's spec, and
#              the compat items that exist for TE-less hosts are not applied ($out/te_dry_run.txt)
# stop-resume: tests/gpu/stop_resume.sh --layer-spec transformer_engine ($out/stop_resume.json)
# train:       gpt_smoke on the recipe defaults with kaiyuan.layer_spec=transformer_engine, 40 steps (/tmp/te_run)
# export:      --export-run's last checkpoint to HF, Megatron-vs-HF logits (tests/gpu/export_proof.sh)
# On any exit: $out/te_proof.json (tests/gpu/te_proof_report.py), the parts' outcomes in one result file.
set -euo pipefail
source tests/gpu/flags.sh
flag parts "dry-run stop-resume export" "which parts, in order"
flag te-site "${KAIYUAN_TE_SITE:-}" "a folder with a built TE (.te-ready names its version), put first on PYTHONPATH"
flag export-run /tmp/stop_resume/reference "the run the export part exports (/tmp/te_run/gpt_smoke: the train part's)"
parse_flags "$@"
# TE from --te-site (a folder with a built TE: its .te-ready file names the version), else the environment's own
if [ -n "$opt_te_site" ] && [ -e "$opt_te_site/.te-ready" ]; then
  te_version=$(cut -d" " -f2 "$opt_te_site/.te-ready")
  export PYTHONPATH="$opt_te_site${PYTHONPATH:+:$PYTHONPATH}"
elif ! te_version=$(python3 -c 'import torch, transformer_engine as te, transformer_engine.pytorch
print(te.__version__)' 2>/dev/null); then
  echo "te_proof: transformer_engine.pytorch does not import here, and --te-site '$opt_te_site' has no built TE" >&2
  exit 4
fi
source tests/gpu/env.sh
: > "$out/te_proof_parts.jsonl"
command=$(printf '%q ' bash tests/gpu/te_proof.sh "$@"); command=${command% }
# On any exit (a failed part, a timeout's SIGTERM): $out/te_proof.json from what the parts left (te_proof_report.py).
trap 'python3 tests/gpu/te_proof_report.py "$out" --command "$command" --parts "$opt_parts" \
        --te-version "$te_version" > /dev/null || true' EXIT
trap 'exit 143' TERM
part_done() {  # part_done PART EXIT START: one line of te_proof_parts.jsonl
  printf '{"part": "%s", "exit": %s, "seconds": %s}\n' "$1" "$2" "$(( $(date +%s) - $3 ))" >> "$out/te_proof_parts.jsonl"
}
for part in $opt_parts; do
  echo "== te_proof: $part ($(date -u +%T))"
  start=$(date +%s)
  trap 'part_done "$part" $? "$start"' ERR
  case $part in
    dry-run) { kaiyuan train gpt_smoke --dry-run kaiyuan.run_root=/tmp/te_dry
               kaiyuan doctor || echo "doctor exited $?"; } 2>&1 | tee "$out/te_dry_run.txt" | tail -60 ;;
    stop-resume) bash tests/gpu/stop_resume.sh --layer-spec transformer_engine --out "$out" ;;
    train) kaiyuan train gpt_smoke kaiyuan.run_root=/tmp/te_run kaiyuan.layer_spec=transformer_engine train.train_iters=40 \
             logger.log_interval=5 > "$out/te_train.log" 2>&1 || { tail -30 "$out/te_train.log"; false; }
           grep -aE "iteration +(5|40)/" "$out/te_train.log" | cut -c1-300 ;;
    export) bash tests/gpu/export_proof.sh --run "$opt_export_run" --name gpt_smoke_te --out "$out" ;;
    *) echo "te_proof: unknown part '$part' (dry-run, stop-resume, train, export)" >&2; exit 2 ;;
  esac
  part_done "$part" 0 "$start"
done
