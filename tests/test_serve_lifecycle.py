"""tests/gpu/serve_lifecycle.sh, as journey.sh uses it, against a real `kaiyuan serve` (tiny model, CPU): the server
it starts is gone, and its port free, once stop_server returns. The control starts the server the way journey.sh
did before (a backgrounded shell function), where stopping $! left the server running: the check must see that."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port
from test_serve import tiny_model  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "tests/gpu/serve_lifecycle.sh"

# Each script ends by printing the server's pid and stop_server's exit code; the server runs on the CPU.
THROUGH_LIB = """source {lib}
start_server {log} {port} {model} --device cpu
wait_until 180 port_open {port} || {{ echo "never listened"; exit 3; }}
stop_server $server_pid {port}; rc=$?; echo "$server_pid $rc"
"""
THROUGH_FUNCTION = """source {lib}
kaiyuan() {{ "$opt_python" -m kaiyuan_recipes.cli.main "$@"; }}
kaiyuan serve {model} --device cpu --port {port} > {log} 2>&1 & pid=$!
wait_until 180 port_open {port} || {{ echo "never listened"; exit 3; }}
server_pid=$(cat /proc/$pid/task/$pid/children)  # the interpreter: the function subshell's child
stop_server $pid {port}; rc=$?; echo "$server_pid $rc"
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("script, stopped", [(THROUGH_LIB, True), (THROUGH_FUNCTION, False)],
                         ids=["start_server", "backgrounded_function_control"])
def test_stop_server_leaves_nothing_running(tiny_model, tmp_path, script, stopped):  # noqa: F811
    port = free_port()
    text = script.format(lib=LIB, log=tmp_path / "serve.log", port=port, model=tiny_model)
    env = {**os.environ, "opt_python": sys.executable}
    done = subprocess.run(["bash", "-c", text], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / "serve.log").read_text()
    pid, rc = (int(x) for x in done.stdout.split()[-2:])
    try:
        assert (rc == 0) is stopped and alive(pid) is not stopped, (tmp_path / "serve.log").read_text()[-2000:]
    finally:
        if alive(pid):
            os.kill(pid, 9)


@pytest.mark.parametrize("args, message", [
    (["--port", "99999"], "--port 99999: a port is 0 to 65535"),
    (["--port", "-1"], "--port -1"),
    (["--max-batch", "0"], "--max-batch 0: must be at least 1"),
    (["--drain-timeout-s", "nan"], "--drain-timeout-s nan"),
    (["--header-timeout-s", "0"], "--header-timeout-s 0.0: must be more than 0"),
    (["--max-queue", "-5"], "--max-queue -5"),
    (["--host", "203.0.113.7"], "--host 203.0.113.7 --port"),  # an address of no interface here
])
def test_bad_serve_options_are_one_line_errors(tiny_model, args, message):  # noqa: F811
    """Each is refused with one line naming the option, exit code 2, no traceback, before the model loads."""
    done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "serve", str(tiny_model), "--device",
                           "cpu", "--port", str(free_port()), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kaiyuan: error: ") and message in lines[0], done.stderr


def test_a_port_in_use_is_a_one_line_error(tiny_model):  # noqa: F811
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "serve", str(tiny_model),
                               "--device", "cpu", "--port", str(port)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip() == f"kaiyuan: error: --host 127.0.0.1 --port {port}: cannot listen there: " \
                                  "Address already in use"


def test_a_vocabulary_smaller_than_the_tokenizers_is_a_one_line_error(tmp_path):
    """A folder exported by hand (or by an older version) whose config.json has fewer vocabulary rows than its
    tokenizer has tokens: named with both sizes, not transformers' assertion deep in the model's construction."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    model = tmp_path / "hf"
    Qwen3ForCausalLM(Qwen3Config(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                 max_position_embeddings=64)).save_pretrained(model)
    AutoTokenizer.from_pretrained(str(default_tokenizer_dir())).save_pretrained(model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"eos_token_id": 151643, "pad_token_id": 151643}))
    done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "serve", str(model), "--device", "cpu",
                           "--port", str(free_port())], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kaiyuan: error: "), done.stderr
    assert "vocab_size 1024 is smaller than its tokenizer's 151646 tokens" in lines[0]
