# Sourced by the GPU scripts (run from the repo root through the device tool) after tests/gpu/flags.sh: results go
# to $out (--out; default $OUT); a wheel set carried with the call (default .whl: `make -C lab gpu-wheels`) is installed
# once into its site folder (default /tmp/site), reinstalled when the carried set differs from the installed one;
# the package runs from the source tree. A script picks another set by setting env_wheels / env_site first (e.g.
# journey.sh --stack fw2606: .whl-fw2606 into /tmp/site-fw2606; names of env.sh's own, so that a script's flags of
# the same meaning, such as nemo2_env.sh's --wheels, do not redirect it). --dry-run skips the install (CPU dry
# runs); --python picks the interpreter of `kaiyuan`.
out=${opt_out:-${OUT:-/tmp/out}}; mkdir -p "$out"
wheels=${env_wheels:-.whl} site=${env_site:-/tmp/site}
if [ "${opt_dry_run:-0}" != 1 ] && [ -d "$wheels" ] && [ "$(ls "$wheels")" != "$(cat "$site/.kaiyuan-wheels" 2>/dev/null)" ]; then
  rm -rf "$site"  # a changed set: nothing of the last one may shadow it
  # the marker only after a complete install: a failed one is removed, not taken for installed next call
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$wheels"/*.whl $(ls "$wheels"/*.tar.gz 2>/dev/null) && ls "$wheels" > "$site/.kaiyuan-wheels" || rm -rf "$site"
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
kaiyuan() { "${opt_python:-python3}" -m kaiyuan_recipes.cli.main "$@"; }
