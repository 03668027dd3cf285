# The team's GPU host: the package is not installed there and the host has no network, so a wheel set travels with
# the tree. lab/gpu.sh sources this file before it runs a tests/gpu script (a benchmark command line may source it
# itself); the scripts only use the PYTHONPATH they are given. The set (KAIYUAN_LAB_WHEELS, default .whl: `make -C
# lab gpu-wheels`) is installed once into its site folder (default /tmp/site), and again whenever the set differs
# from the installed one; the package runs from the source tree, first on PYTHONPATH. A caller picks another set by
# setting env_wheels / env_site first; lab_stack=fw2606 (lab/gpu.sh sets it for journey.sh --stack fw2606) means
# .whl-fw2606 into /tmp/site-fw2606 (`make -C lab gpu-wheels-fw2606`), refused before anything runs where that set
# is missing. opt_dry_run=1 (lab/gpu.sh: the script's --dry-run) skips the install (CPU dry runs).
if [ -n "${lab_stack:-}" ]; then
  env_wheels=${env_wheels:-.whl-$lab_stack} env_site=${env_site:-/tmp/site-$lab_stack}
  if [ ! -d "$env_wheels" ]; then
    echo "${lab_script:-$0}: --stack $lab_stack needs $env_wheels carried with the call (make -C lab gpu-wheels-$lab_stack)" >&2
    exit 2
  fi
fi

# lab_install_wheels WHEELS SITE [PIP_ARGS...]: install WHEELS into SITE unless SITE holds that very set. A changed
# set replaces the last one whole (nothing of it may shadow the new one); the marker is written only after a complete
# install, so a failed one is removed, not taken for installed next time.
lab_install_wheels() {
  local wheels=$1 site=$2; shift 2
  [ -d "$wheels" ] && [ "$(ls "$wheels")" != "$(cat "$site/.kaiyuan-wheels" 2>/dev/null)" ] || return 0
  rm -rf "$site"
  python3 -m pip install -q "$@" --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$wheels"/*.whl $(ls "$wheels"/*.tar.gz 2>/dev/null) && ls "$wheels" > "$site/.kaiyuan-wheels" || rm -rf "$site"
}

wheels=${env_wheels:-${KAIYUAN_LAB_WHEELS:-.whl}} site=${env_site:-/tmp/site}
[ "${opt_dry_run:-0}" = 1 ] || lab_install_wheels "$wheels" "$site" --upgrade
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
kaiyuan() { "${opt_python:-python3}" -m kaiyuan_recipes.cli.main "$@"; }

# lab_peer_sites PEER...: peer_throughput.sh's peer sets (`make -C lab titan-wheels olmo-wheels`): .whl-PEER installed
# into /tmp/site-PEER (lab_peer_root instead of /tmp where set; .whl-olmo is too large to travel beside .whl, so it
# is installed in a run of its own: --install-only) and appended to sites. A set neither carried nor installed is
# named and the others still go on; the return is then 2.
lab_peer_sites() {
  local peer wheels site missing=0
  for peer in "$@"; do
    wheels=.whl-$peer site=${lab_peer_root:-/tmp}/site-$peer
    lab_install_wheels "$wheels" "$site"
    if [ -f "$site/.kaiyuan-wheels" ]; then
      echo "$site: $(wc -l < "$site/.kaiyuan-wheels") wheels"
      sites+=("$site")
    else
      echo "no $site: carry $wheels (make -C lab $peer-wheels)"
      missing=1
    fi
  done
  return $((2 * missing))
}
