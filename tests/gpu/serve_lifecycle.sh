# Sourced by journey.sh (and tests/test_serve_lifecycle.py on the CPU host): a `kaiyuan serve` started in the
# background and stopped again with nothing left running. The interpreter itself is backgrounded, not a shell
# function wrapping it: $! of a backgrounded function is a subshell, and killing that left the server running
# (holding its port and GPU memory) through the rest of the journey.

wait_until() {  # wait_until SECONDS CMD...: poll CMD every second until it succeeds (bounded)
  local deadline=$((SECONDS + $1)); shift
  until "$@" > /dev/null 2>&1; do [ $SECONDS -gt $deadline ] && return 1; sleep 1; done
}

port_open() {  # port_open PORT: something accepts connections on 127.0.0.1:PORT (bash's /dev/tcp, no curl needed)
  (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null
}

start_server() {  # start_server LOG PORT MODEL_DIR [ARGS...]: `kaiyuan serve` in the background; sets server_pid
  local log=$1 port=$2; shift 2
  "${opt_python:-python3}" -m kaiyuan_recipes.cli.main serve "$@" --port "$port" > "$log" 2>&1 &
  server_pid=$!
}

stop_server() {  # stop_server PID PORT: SIGTERM; the process is gone within 60 s and nothing listens on PORT
  kill "$1" && wait_until 60 eval "! kill -0 $1" && ! port_open "$2"
}
