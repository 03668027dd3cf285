# Sourced by the GPU scripts after tests/gpu/flags.sh and parse_flags: results go to $out (--out), the environment's
# python3 and its kaiyuan_recipes (`make env`, or a pip install) are used as they are, and `kaiyuan` is the CLI
# through that interpreter (--python, where a script has it, picks another). Nothing is installed.
# KAIYUAN_LAB_WHEELS (set only by the team's lab/ tooling) hands the set-up to lab/gpu_host_env.sh instead.
if [ -n "${KAIYUAN_LAB_WHEELS:-}" ]; then source lab/gpu_host_env.sh; fi
out=${opt_out:-gpu-results}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
kaiyuan() { "${opt_python:-python3}" -m kaiyuan_recipes.cli.main "$@"; }
