# Sourced by the GPU scripts after tests/gpu/flags.sh and parse_flags: results go to $out (--out), the environment's
# python3 and its kaiyuan_recipes (`make env`, or a pip install) are used as they are, and `kaiyuan` is the CLI
# through that interpreter (--python, where a script has it, picks another). Nothing is installed: a host without the
# package installed puts the source tree (and what it needs) on PYTHONPATH before the script runs.
out=${opt_out:-gpu-results}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
kaiyuan() { "${opt_python:-python3}" -m kaiyuan_recipes.cli.main "$@"; }
