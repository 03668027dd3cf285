# Sourced by the journey scripts after env.sh: each step run, timed and recorded in $steps (one JSON line),
# its output in $logs/NAME.log; and the checks on a run that the journeys share (the run root is $runs).

# step NAME EXPECT CMD...: run CMD (its output to $out/NAME.log), record exit code and wall time.
# EXPECT is the exit code the journey needs (0, or "nonzero" for a refusal, or "any": recorded only).
step() {
  local name=$1 expect=$2; shift 2
  local t0=$SECONDS start; start=$(date +%s.%N)
  "$@" > "$logs/$name.log" 2>&1; local rc=$?
  local wall; wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  local ok=false
  case $expect in
    any) ok=true ;;  # recorded, not required (its exit code and log are the finding)
    nonzero) [ $rc -ne 0 ] && ok=true ;;
    *) [ $rc -eq "$expect" ] && ok=true ;;
  esac
  echo "{\"step\": \"$name\", \"rc\": $rc, \"wall_s\": $wall, \"ok\": $ok, \"command\": $(python3 -c 'import json, shlex, sys; print(json.dumps(shlex.join(sys.argv[1:])))' "$@")}" >> "$steps"
  echo "[$name] rc=$rc ${wall}s ok=$ok"; tail -3 "$logs/$name.log"
  [ $ok = true ]
}

expect_state() {  # expect_state RUN STATE: `kaiyuan status RUN` (printed) says STATE
  local status; status=$(kaiyuan status "$1" --run-root $runs); echo "$status"
  echo "$status" | grep -q "\"state\": \"$2\""
}

not_running() { ! kaiyuan status "$1" --run-root $runs | grep -q '"state": "running"'; }

reached() {  # reached RUN ITERATION: the run's metrics log has a step at or past ITERATION
  python3 - "$runs/$1/run_state/metrics.jsonl" "$2" <<'PY'
import json, sys
try:
    its = [json.loads(l)["iteration"] for l in open(sys.argv[1]) if '"step"' in l]
except FileNotFoundError:
    its = []
sys.exit(0 if its and its[-1] >= int(sys.argv[2]) else 1)
PY
}

write_heldout_input() {  # write_heldout_input FILE: 4 prompt/completion rows per dimension, half of them with choices
  python3 - "$1" <<'PY'
import json, sys
from kaiyuan_recipes.data.heldout import DIMENSIONS
with open(sys.argv[1], "w", encoding="utf-8") as fh:
    for dim in DIMENSIONS:
        for i in range(4):
            row = {"dimension": dim, "prompt": f"[{dim} #{i}] 问题：{i}+{i}=?\n答：", "completion": f" {2 * i}"}
            if i % 2 == 0:
                row |= {"choices": [f" {2 * i}", f" {2 * i + 1}", " 0"], "answer": 0}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
PY
}
