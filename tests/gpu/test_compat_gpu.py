"""GPU: compat workarounds whose defect only shows on CUDA, each probed by running the defective sequence itself
(upstream's code, our workaround off) and asserting on its specific failure; when a probe fails, upstream fixed
the defect: drop the workaround (kaiyuan_recipes/compat, WORKAROUNDS says for which versions it is needed).
    python3 -m pytest -q -m gpu tests/gpu/test_compat_gpu.py      (on a CUDA GPU)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# The end of a full_iteration CUDA-graph run, as Megatron-Bridge and megatron-core do it: the training step is
# captured into megatron-core's shared pool (use_single_mempool=True, upstream's default) and its static output
# kept (as FullCudaGraphWrapper.result keeps it); Bridge's _delete_cuda_graphs deletes the graph; then the final
# evaluation is captured into get_graph_pool(SINGLE). In a fresh process: a failed capture leaves its stream set.
END_OF_TRAINING = textwrap.dedent("""
    import sys, torch
    from kaiyuan_recipes import compat
    compat.apply()  # what kaiyuan does at start (megatron.bridge imports TE otherwise)
    from megatron.bridge.training import train
    from megatron.core import full_cuda_graph as fcg

    single = sys.argv[1] == "single"
    x = torch.ones(1 << 20, device="cuda")

    def capture(pool):
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x * 2  # warm-up outside the capture, as upstream does
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph, pool=pool):
            out = x * 2
        return graph, out

    graph, kept_output = capture(fcg.get_graph_pool(use_single_mempool=True))
    fcg.FullCudaGraphWrapper.cuda_graph["training"] = graph
    del graph
    train._delete_cuda_graphs(None)
    torch.cuda.synchronize()
    try:
        evaluation, out = capture(fcg.get_graph_pool(use_single_mempool=single))
    except RuntimeError as err:
        print("capture failed:", str(err).splitlines()[0])
        sys.exit(3)
    evaluation.replay()
    torch.cuda.synchronize()
    print("captured and replayed:", bool(torch.equal(out, x * 2)))
""")


def _in_a_fresh_process(script: str, which: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, which], capture_output=True, text=True, timeout=300)


def test_upstream_final_evaluation_capture_still_fails_in_the_deleted_training_graphs_pool():
    """compat.separate_full_graph_pools (model.cuda_graph_use_single_mempool=False): without it the final
    evaluation's capture hits PyTorch's allocator assert on the released pool."""
    upstream = _in_a_fresh_process(END_OF_TRAINING, "single")
    assert upstream.returncode == 3, upstream.stdout + upstream.stderr[-3000:]
    assert "use_count > 0" in upstream.stdout, upstream.stdout


def test_with_a_pool_per_capture_the_final_evaluation_captures_and_replays():
    """The control: what compat sets (a new pool per capture) captures and replays the same sequence."""
    ours = _in_a_fresh_process(END_OF_TRAINING, "own")
    assert ours.returncode == 0, ours.stdout + ours.stderr[-3000:]
    assert "captured and replayed: True" in ours.stdout


# A capture that CUDA invalidates (a host sync inside it), in a fresh process: is the stream current before it
# current again after the failure?
FAILED_CAPTURE = textwrap.dedent("""
    import sys, torch
    from kaiyuan_recipes import compat

    capture = torch.cuda.graph if sys.argv[1] == "upstream" else compat.graph_capture
    x = torch.ones(4, device="cuda")
    before = torch.cuda.current_stream()
    try:
        with capture(torch.cuda.CUDAGraph()):
            x.sum().item()  # a sync: not permitted while the stream captures
    except RuntimeError as err:
        print("capture failed:", str(err).splitlines()[0])
    else:
        sys.exit("the capture did not fail")
    print("stream restored" if torch.cuda.current_stream() == before else "capture stream left current")
""")


def test_upstream_failed_capture_still_leaves_its_capture_stream_current():
    """compat.graph_capture: without it, torch.cuda.graph's exit fails in capture_end before it leaves its stream
    context, so its capture stream stays the current one."""
    upstream = _in_a_fresh_process(FAILED_CAPTURE, "upstream")
    assert upstream.returncode == 0, upstream.stdout + upstream.stderr[-3000:]
    assert "capture stream left current" in upstream.stdout, upstream.stdout


def test_with_compat_graph_capture_a_failed_capture_restores_the_stream():
    """The control: the same failed capture through compat.graph_capture leaves the stream it found."""
    ours = _in_a_fresh_process(FAILED_CAPTURE, "ours")
    assert ours.returncode == 0, ours.stdout + ours.stderr[-3000:]
    assert "stream restored" in ours.stdout, ours.stdout
