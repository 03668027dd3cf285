# Sourced by the GPU scripts (run from the repo root through the device tool) after tests/gpu/flags.sh: results go
# to $out (--out; default $OUT); the wheel set carried in .whl (`make gpu-wheels`, ../shared/gpu-host/fetch-wheels.sh)
# is installed once into /tmp/site, reinstalled when the carried set differs from the installed one; the package
# runs from the source tree. --dry-run skips the install (CPU dry runs); --python picks the interpreter of `kaiyuan`.
out=${opt_out:-${OUT:-/tmp/out}}; mkdir -p "$out"
if [ "${opt_dry_run:-0}" != 1 ] && [ -d .whl ] && [ "$(ls .whl)" != "$(cat /tmp/site/.kaiyuan-wheels 2>/dev/null)" ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl .whl/*.tar.gz
  ls .whl > /tmp/site/.kaiyuan-wheels
fi
export PYTHONPATH="$PWD:$PWD/exporters:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
kaiyuan() { "${opt_python:-python3}" -m kaiyuan_recipes.cli.main "$@"; }
