#!/usr/bin/env bash
# A queue of GPU jobs that outlives one device call. The team's host gives each call at most 600 s and keeps the
# machine (and /tmp) only while calls follow each other closely, so long work runs detached and each later call
# waits on it and brings back what it has so far:
#   bash lab/queue.sh start -- "bash lab/gpu.sh tests/gpu/journey_qwen3.sh --rev R" "bash lab/gpu.sh ..."
#   bash lab/queue.sh wait [--max-s 570]      (repeat, one call after the other, until it prints "queue: done")
#   bash lab/queue.sh status | stop
# start copies the tree to QUEUE_DIR/tree (a later call's tree may differ) and runs the jobs there one after the
# other, detached (setsid), each with OUT=QUEUE_DIR/out/NN (job NN's results) and its output in
# QUEUE_DIR/out/NN/job.log; a failing job does not stop the next. QUEUE_DIR/jobs.jsonl records each job's command,
# start, end and exit code. wait polls until the queue is done or --max-s passes, prints each job's state and the
# running job's log tail, and packs QUEUE_DIR/out into $OUT/queue.tgz (the device tool brings it back).
set -euo pipefail
QUEUE_DIR=${QUEUE_DIR:-/tmp/queue}
verb=${1:-}; shift || true

jobs_state() {  # one line per job: NN state rc seconds command
  python3 - "$QUEUE_DIR" <<'PY'
import json, sys, time
from pathlib import Path
q = Path(sys.argv[1])
cmds = json.loads((q / "commands.json").read_text())
rec = {}
for line in (q / "jobs.jsonl").read_text().splitlines() if (q / "jobs.jsonl").exists() else []:
    r = json.loads(line)
    rec.setdefault(r["job"], {}).update(r)
for i, cmd in enumerate(cmds):
    r = rec.get(i, {})
    state = "done" if "rc" in r else "running" if "start" in r else "queued"
    took = (r.get("end") or time.time()) - r["start"] if "start" in r else 0
    print(f"{i:02d} {state} rc={r.get('rc', '-')} {took:.0f}s {cmd}")
PY
}

pack() {
  local dest=${OUT:-}
  [ -n "$dest" ] || return 0
  mkdir -p "$dest"
  tar czf "$dest/queue.tgz" -C "$QUEUE_DIR" out jobs.jsonl commands.json 2>/dev/null || true
  cp "$QUEUE_DIR/jobs.jsonl" "$dest/queue_jobs.jsonl" 2>/dev/null || true
}

runner_alive() {
  [ -f "$QUEUE_DIR/runner.pid" ] && kill -0 "$(cat "$QUEUE_DIR/runner.pid")" 2>/dev/null
}

case "$verb" in
start)
  [ "${1:-}" = "--" ] && shift
  [ $# -gt 0 ] || { echo "usage: bash lab/queue.sh start -- \"COMMAND\" [\"COMMAND\" ...]" >&2; exit 2; }
  if runner_alive; then echo "queue: a queue runs already in $QUEUE_DIR (bash lab/queue.sh wait)" >&2; exit 2; fi
  rm -rf "$QUEUE_DIR"; mkdir -p "$QUEUE_DIR/out" "$QUEUE_DIR/tree"
  # the tree as it is now, without the run folders and results a call may bring along
  tar cf - --exclude=./.git --exclude="./.venv*" --exclude=./gpu-results --exclude=./runs . | tar xf - -C "$QUEUE_DIR/tree"
  python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" > "$QUEUE_DIR/commands.json"
  : > "$QUEUE_DIR/jobs.jsonl"
  cat > "$QUEUE_DIR/runner.sh" <<'RUNNER'
set -u
q=$1; cd "$q/tree"
n=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))))' "$q/commands.json")
for ((i = 0; i < n; i++)); do
  cmd=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[int(sys.argv[2])])' "$q/commands.json" "$i")
  dir=$(printf '%s/out/%02d' "$q" "$i"); mkdir -p "$dir"
  echo "{\"job\": $i, \"start\": $(date +%s.%N)}" >> "$q/jobs.jsonl"
  OUT=$dir bash -c "$cmd" > "$dir/job.log" 2>&1 < /dev/null
  rc=$?
  echo "{\"job\": $i, \"end\": $(date +%s.%N), \"rc\": $rc}" >> "$q/jobs.jsonl"
done
echo done > "$q/finished"
RUNNER
  setsid -f bash -c 'echo $$ > "$1/runner.pid"; exec bash "$1/runner.sh" "$1"' _ "$QUEUE_DIR" \
    > "$QUEUE_DIR/runner.log" 2>&1 < /dev/null
  for _ in $(seq 50); do [ -f "$QUEUE_DIR/runner.pid" ] && break; sleep 0.1; done
  echo "queue: started $# job(s) in $QUEUE_DIR"
  jobs_state
  ;;
wait)
  max_s=570
  [ "${1:-}" = "--max-s" ] && max_s=$2
  [ -f "$QUEUE_DIR/commands.json" ] || { echo "queue: none in $QUEUE_DIR (bash lab/queue.sh start first)" >&2; exit 2; }
  deadline=$((SECONDS + max_s))
  while [ ! -f "$QUEUE_DIR/finished" ] && runner_alive && [ $SECONDS -lt $deadline ]; do sleep 5; done
  jobs_state
  running=$(jobs_state | awk '$2 == "running" {print $1}' | head -1)
  if [ -n "$running" ]; then echo "--- job $running, last lines:"; tail -n 15 "$QUEUE_DIR/out/$running/job.log"; fi
  pack
  if [ -f "$QUEUE_DIR/finished" ]; then echo "queue: done"
  elif ! runner_alive; then echo "queue: the runner is gone before the end (see $QUEUE_DIR/runner.log)"; exit 1
  else echo "queue: still running (wait again)"; fi
  ;;
stop)  # the runner and its job: the runner leads its own session (setsid), so its process group holds both
  if runner_alive; then kill -TERM -- "-$(cat "$QUEUE_DIR/runner.pid")" && echo "queue: stopped"; else echo "queue: not running"; fi
  ;;
status)
  [ -f "$QUEUE_DIR/commands.json" ] || { echo "queue: none in $QUEUE_DIR"; exit 0; }
  jobs_state
  ;;
*)
  echo "usage: bash lab/queue.sh start -- \"COMMAND\" ... | wait [--max-s S] | status | stop" >&2; exit 2
  ;;
esac
