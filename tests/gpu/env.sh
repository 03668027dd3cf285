# Sourced by the GPU scripts (run from the repo root through the device tool): results go to $out; the
# wheel set carried in .whl (../shared/gpu-host/fetch-wheels.sh) is installed once into /tmp/site;
# the package runs from the source tree. DRY_RUN=1 skips the install (CPU dry runs).
out=${OUT:-/tmp/out}; mkdir -p "$out"
# (`make gpu-wheels` builds .whl); reinstalled when the carried set differs from the installed one.
if [ "${DRY_RUN:-0}" != 1 ] && [ -d .whl ] && [ "$(ls .whl)" != "$(cat /tmp/site/.kaiyuan-wheels 2>/dev/null)" ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl .whl/*.tar.gz
  ls .whl > /tmp/site/.kaiyuan-wheels
fi
export PYTHONPATH="$PWD:$PWD/exporters:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
kaiyuan() { "${PYTHON:-python3}" -m kaiyuan_recipes.cli.main "$@"; }
