#!/usr/bin/env bash
# Transformer Engine on the GPU host, over back-to-back device calls (docs/te.md). Every call runs, from the repo root:
#   bash lab/gpu.sh lab/te_env.sh [--wait 480]     (--out $OUT: lab/README.md)
# carrying that call's line of `make te-wheels` (the manifest and one part; nothing once the set is staged).
#  1. `stage.py receive te`: keeps the carried part, says what is missing, or that the machine is cold.
#  2. Once all parts are there: installs the wheels (core library, Python package, build tools) into --site and
#     starts the PyTorch extension's build detached (setsid), against the host's torch; log in --build-dir.
#  3. Later calls: the build's progress (elapsed time, log tail) or its end; the detached job installs the built
#     wheel into --site, and a finished build is reused by every later call while the machine stays held.
#  4. `import transformer_engine.pytorch` with PYTHONPATH=--site, printing TE's version.
# Exit: 0 TE imports; 3 more parts needed; 4 cold machine (nothing staged or built); 5 building; 1 failed.
# Then use it with PYTHONPATH=/tmp/site-te:$PYTHONPATH. Writes $out/te_env.json. On a CPU host --dry-run walks the
# same steps (staging for real) and prints the installs and the build instead of running them.
set -euo pipefail
source tests/gpu/flags.sh
flag stage-src .stage "where the carried .stage/te/ is"
flag stage-root /tmp/stage "where stage.py keeps the parts and the reassembled set"
flag site /tmp/site-te "where TE, its build tools and its import's packages are installed"
flag build-dir /tmp/te-build "the extension build's script, log, pid, start time and exit code"
flag jobs 16 "MAX_JOBS of the extension build"
flag wait 0 "seconds this call waits for a running build to end (polling every 15 s)"
flag python python3 "the interpreter (and torch) the extension is built for"
switch rebuild "discard a finished or failed build and start it again"
switch dry-run "stage for real, print the installs, the build and the import check instead of running them"
parse_flags "$@"
out=$opt_out; mkdir -p "$out"
py=$opt_python site=$opt_site bdir=$opt_build_dir files=$opt_stage_root/te/files
stage() { "$py" lab/stage.py "$@"; }
run() { if [ "$opt_dry_run" = 1 ]; then echo "dry run, would run: $*"; else "$@"; fi; }
report() {  # report STATE [EXTRA_JSON_FIELDS]: the call's outcome for the next person's measurements
  printf '{"state": "%s", "time": %s, "dry_run": %s%s}\n' "$1" "$(date +%s)" "$opt_dry_run" "${2:+, $2}" \
    > "$out/te_env.json"
}
trap 'echo "te: FAILED at line $LINENO of $0"; report failed' ERR
# torch first, as every user does: TE's core library needs libnccl.so.2, which torch loads from its nvidia-nccl package.
import_check='import torch, transformer_engine as te, transformer_engine.pytorch; print(te.__version__)'
te_import() { PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$py" -c "$import_check"; }
ready() {  # the import check; exits 0 with the version, or 1
  if [ "$opt_dry_run" = 1 ]; then echo "te: ready (dry run: import transformer_engine.pytorch not checked)"
    report ready; exit 0; fi
  local v
  if v=$(te_import 2>"$out/te_import.err"); then
    echo "te: ready: transformer_engine $v imports (PYTHONPATH=$site)"; echo "$set_id $v" > "$site/.te-ready"
    report ready "\"te_version\": \"$v\""; exit 0
  fi
  echo "te: FAILED: import transformer_engine.pytorch:"; tail -20 "$out/te_import.err"; report failed; exit 1
}

# 1. Staging. A set installed and built earlier in this lease is reused (the carried manifest, if any, must match).
rc=0; stage receive te --src "$opt_stage_src" --root "$opt_stage_root" || rc=$?
if [ $rc = 4 ]; then
  echo "te: COLD MACHINE: nothing staged under $opt_stage_root and nothing built in $bdir (a fresh machine: the"
  echo "te: lease ended since the last call, or this is the first). Staging starts again: carry the lines of"
  echo "te: 'make te-wheels' from call 1, back to back."
  report cold; exit 4
fi
if [ $rc = 3 ]; then
  report staging "\"stage\": $(stage status te --root "$opt_stage_root" | tr -d '\n' || true)"; exit 3
fi
if [ $rc != 0 ]; then report failed; exit 1; fi
set_id=$(stage status te --root "$opt_stage_root" \
  | "$py" -c 'import json, sys; print(json.load(sys.stdin)["manifest_sha256"])')
if [ "$(cut -d' ' -f1 "$site/.te-ready" 2>/dev/null)" = "$set_id" ] && [ "$opt_rebuild" = 0 ]; then
  echo "te: built earlier in this lease ($(cut -d' ' -f2 "$site/.te-ready"))"; ready
fi

# 2. The wheels into --site, once per staged set (one pip call: separate --target installs would clobber the shared
# transformer_engine/ folder).
if [ "$(cat "$site/.te-set" 2>/dev/null)" != "$set_id" ]; then
  run rm -rf "$site"
  run "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$files"/*.whl
  [ "$opt_dry_run" = 1 ] || echo "$set_id" > "$site/.te-set"
fi

# 3. The extension build: finished, running, dead, or not started.
mkdir -p "$bdir"
if [ "$(cat "$bdir/set" 2>/dev/null)" != "$set_id" ] || [ "$opt_rebuild" = 1 ]; then
  if [ -s "$bdir/pid" ] && [ ! -e "$bdir/done" ] && kill -0 "$(cat "$bdir/pid")" 2>/dev/null; then
    echo "te: a build of another set (or one to redo) is still running (pid $(cat "$bdir/pid")); wait for it"
    report failed; exit 1
  fi
  rm -rf "$bdir"; mkdir -p "$bdir"; echo "$set_id" > "$bdir/set"
fi
progress() {
  local now started; now=$(date +%s); started=$(cat "$bdir/started" 2>/dev/null || echo "$now")
  elapsed=$((now - started))
  step=$(grep -aoE '^ *\[[0-9]+/[0-9]+\]' "$bdir/build.log" 2>/dev/null | tail -1 | tr -d ' ' || true)
  echo "te: build running for $((elapsed / 60)) min $((elapsed % 60)) s${step:+, ninja step $step}; log tail:"
  tail -5 "$bdir/build.log" 2>/dev/null | cut -c1-200 | sed 's/^/  | /' || true
}
if [ ! -e "$bdir/started" ]; then
  # TE and torch take CUDA_HOME from nvcc's folder: a wrapper on PATH (/usr/local/bin/nvcc) would make it /usr/local.
  cuda_home=${CUDA_HOME:-}
  if [ -z "$cuda_home" ]; then
    for d in /usr/local/cuda "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /nvcc)")")")"; do
      if [ -x "$d/bin/nvcc" ] && [ -e "$d/include/cuda_runtime.h" ]; then cuda_home=$d; break; fi
    done
  fi
  echo "te: CUDA_HOME=${cuda_home:-NOT FOUND}"
  if [ -z "$cuda_home" ] && [ "$opt_dry_run" = 0 ]; then echo "te: FAILED: no CUDA toolkit"; report failed; exit 1; fi
  # cudnn.h and nccl.h (and, from a minimal toolkit, cublasLt.h and nvrtc.h) come with the torch wheel's nvidia-*
  # packages. CPATH is searched after the -I folders, so the toolkit's own headers still win.
  cpath=$("$py" -c 'import glob, os, site; print(":".join(sorted({d for r in site.getsitepackages()
    for d in glob.glob(os.path.join(r, "nvidia", "*", "include"))})))')
  for h in cublasLt.h cudnn.h nccl.h nvrtc.h; do
    found=$(for d in "$cuda_home/include" /usr/include ${cpath//:/ }; do [ -e "$d/$h" ] && echo "$d"; done \
      | head -1 || true)
    echo "te: $h from ${found:-NOWHERE}"
    if [ -z "$found" ] && [ "$opt_dry_run" = 0 ]; then echo "te: FAILED: no $h for the build"; report failed; exit 1; fi
  done
  sdist=$(ls "$files"/transformer_engine_torch-*.tar.gz 2>/dev/null | head -1)
  if [ -z "$sdist" ]; then echo "te: FAILED: no transformer_engine_torch sdist in $files"; report failed; exit 1; fi
  cat > "$bdir/build.sh" <<SH
# Written by lab/te_env.sh; runs detached. The exit code goes to done, last.
echo \$\$ > "$bdir/pid"
trap 'echo \$? > "$bdir/done.tmp"; mv "$bdir/done.tmp" "$bdir/done"' EXIT
set -ex
export PYTHONPATH="$site" CUDA_HOME="$cuda_home" CPATH="$cpath\${CPATH:+:\$CPATH}"
export NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=$opt_jobs
export NVTE_NO_LOCAL_VERSION=1  # no +git suffix: the version must equal the core wheel's, or the import refuses
"$py" -m pip wheel -v --no-build-isolation --no-deps --no-index -w "$bdir/wheel" "$sdist"
"$py" -m pip install --no-index --no-deps --no-compile --target "$bdir/site-torch" "$bdir"/wheel/*.whl
cp -a "$bdir/site-torch/." "$site/"  # merged in: a second --target install into $site would replace transformer_engine/
PYTHONPATH="$site" "$py" -c '$import_check'
SH
  date +%s > "$bdir/started"
  if [ "$opt_dry_run" = 1 ]; then
    echo "dry run, would start detached: setsid bash $bdir/build.sh > $bdir/build.log"
  else
    setsid -f bash "$bdir/build.sh" > "$bdir/build.log" 2>&1 < /dev/null
    echo "te: build started (detached, MAX_JOBS=$opt_jobs); log $bdir/build.log"
  fi
fi
deadline=$(( $(date +%s) + opt_wait ))
while :; do
  if [ -e "$bdir/done" ]; then
    code=$(cat "$bdir/done")
    if [ "$code" = 0 ]; then echo "te: build finished"; ready; fi
    echo "te: FAILED: the build exited $code; log tail:"; tail -30 "$bdir/build.log" 2>/dev/null | cut -c1-300 || true
    echo "te: after a fix, --rebuild starts it again"; report failed "\"build_exit\": $code"; exit 1
  fi
  if [ -s "$bdir/pid" ] && ! kill -0 "$(cat "$bdir/pid")" 2>/dev/null && [ ! -e "$bdir/done" ]; then
    echo "te: FAILED: the build (pid $(cat "$bdir/pid")) is gone without an exit code; --rebuild starts it again"
    report failed; exit 1
  fi
  progress
  [ "$(date +%s)" -lt "$deadline" ] && [ "$opt_dry_run" = 0 ] || break
  sleep 15
done
report building "\"build_elapsed_s\": $elapsed"
exit 5
