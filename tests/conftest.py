import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

# Offline by construction: nothing in the CPU suite may reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _session_dir(prefix: str) -> str:
    """A folder for this test process, removed when it exits (each xdist worker makes its own)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# The bundled tokenizer and the tokenized sample corpus go to a cache made for this test session.
if "KAIYUAN_CACHE" not in os.environ:
    os.environ["KAIYUAN_CACHE"] = _session_dir("kaiyuan-test-cache-")
# The launching process refuses a host without a GPU; the tests' ranks stand in for training on the CPU.
os.environ.setdefault("KAIYUAN_ALLOW_NO_GPU", "1")
# NeMo-Run reads its home once, at import: experiments of this session go to a temporary one.
os.environ["NEMORUN_HOME"] = _session_dir("kaiyuan-test-nemo-run-")

# Signal dispositions and the blocked-signal mask are inherited by every process a test starts, and a process that
# inherits an ignored SIGINT keeps ignoring it (Python then installs no KeyboardInterrupt handler). A shell without
# job control starts its background commands with SIGINT ignored, so `make test &` (or a CI job started that way)
# made every Ctrl-C test's child deaf to the signal it tests. The session runs as from a terminal: SIGINT raises
# KeyboardInterrupt and nothing is blocked; each test starts from that, whatever an earlier one left behind
# (in-process library code may change either).
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
_SESSION_SIGNALS = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, set()))


@pytest.fixture(autouse=True)
def signals_as_the_session_had_them(request):
    yield
    handler, blocked = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, set())
    if (handler, blocked) != _SESSION_SIGNALS:
        signal.signal(signal.SIGINT, _SESSION_SIGNALS[0])
        signal.pthread_sigmask(signal.SIG_SETMASK, _SESSION_SIGNALS[1])
        import warnings

        warnings.warn(f"{request.node.nodeid} left SIGINT {handler!r} with {sorted(blocked)} blocked; restored")


def megatron_forward_on_cpu(setattr=setattr) -> None:
    """Patch the CUDA-only lines of megatron-core's GPT forward on this CPU host: RoPE moves its table to the
    GPU, the local spec's softmax builds its causal mask there and forks the CUDA RNG around its (here zero)
    attention dropout. Pass pytest's monkeypatch.setattr to undo it after the test."""
    import contextlib

    import torch
    from megatron.core import tensor_parallel
    from megatron.core.fusions import fused_softmax

    setattr(torch.cuda, "current_device", lambda: "cpu")
    setattr(fused_softmax, "get_default_causal_mask",
            lambda sq: torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1))
    setattr(tensor_parallel.get_cuda_rng_tracker(), "fork", contextlib.nullcontext)


def tiny_gpt_shape(**changes) -> dict:
    """gpt_smoke's model file at a size a CPU test builds in a second (one layer, hidden 64, vocab 512)."""
    from kaiyuan_recipes.config.recipe_tree import load_model_file

    return load_model_file("gpt_smoke") | {"num_layers": 1, "hidden_size": 64, "ffn_hidden_size": 128,
                                          "num_attention_heads": 4, "num_query_groups": 2, "kv_channels": 16,
                                          "vocab_size": 512, **changes}


@pytest.fixture(scope="module")
def megatron_parallel():
    """megatron-core's parallel state in this one process (gloo on the CPU, NCCL on a GPU), for real
    model construction. Torn down after the module: an initialised process group changes what world
    size upstream sees."""
    from kaiyuan_recipes import compat

    compat.apply()
    import torch
    from megatron.core import parallel_state

    cuda = torch.cuda.is_available()
    if not torch.distributed.is_initialized():
        # An in-process store: no port, so test files running at once (make test's workers) cannot collide.
        torch.distributed.init_process_group("nccl" if cuda else "gloo", store=torch.distributed.HashStore(),
                                             rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    if cuda:
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1234)
    yield parallel_state
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def process_group():
    """The export's own single-process group (kaiyuan_recipes.export.megatron_to_hf), torn down after the module."""
    import torch

    from kaiyuan_recipes.export.megatron_to_hf import ensure_single_process_group

    ensure_single_process_group()
    yield
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


# Two "nodes" for the multi-node tests: two loopback addresses served by one real OpenSSH sshd.
NODES = ("127.0.0.1", "127.0.0.2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    binary = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(binary):
        pytest.fail("OpenSSH's sshd is needed for the multi-node tests (make test installs openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", *(f"ListenAddress {a}" for a in NODES), f"HostKey {d / 'host_key'}",
        f"PidFile {d / 'sshd.pid'}", f"AuthorizedKeysFile {d / 'authorized_keys'}", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password",
        "LogLevel ERROR", ""]))
    host_key = (d / "host_key.pub").read_text().split()[:2]
    (d / "known_hosts").write_text("".join(f"[{a}]:{port} {' '.join(host_key)}\n" for a in NODES))
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen([binary, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection((NODES[1], port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited: {proc.stderr.read()}")
            time.sleep(0.2)
    yield {"port": port, "key": str(d / "client_key"), "known_hosts": str(d / "known_hosts")}
    proc.terminate()
    proc.wait(timeout=10)


