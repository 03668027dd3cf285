"""The serving engine on a CUDA GPU:
    python3 -m pytest -q -s tests/gpu/test_serve_gpu.py
With the step's forward compiled and every bucket's step captured, every CUDA graph is captured and every
compilation made during warm-up and none after, whatever the load (batch sizes, prompt lengths, greedy and
sampled rows, joins mid-batch); greedy rows of the captured steps (compiled or not) equal transformers'
generate token for token in fp32 (a small random Qwen3 with a 512-token vocabulary, so greedy choices are
not near-ties, TF32 off); and the captured steps give the eager steps' tokens, greedy and sampled, in fp32.
Not in bf16: there a captured step's logits differ from the eager step's in rare low bits (cuBLAS picks its
kernels under capture), enough to flip a sampled near-tie (seen on an H200)"""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen3Config

    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    out = tmp_path_factory.mktemp("gpu_serve") / "hf"
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(default_tokenizer_dir())).save_pretrained(out)
    GenerationConfig(eos_token_id=151643, pad_token_id=151643, do_sample=False).save_pretrained(out)  # never drawn
    return out


def prompts(count: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 512, (int(n),), generator=gen).tolist()
            for n in torch.randint(3, 300, (count,), generator=gen)]


def engine_for(model_dir, dtype, capture=True, compile=True):
    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine

    engine = GenerationEngine(model_dir, "cuda", Envelope(16, 1024, capture, compile and capture), dtype)
    assert engine.ready.wait(600) and engine.failure is None
    return engine


@pytest.fixture(autouse=True)
def exact_fp32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def test_no_capture_or_compilation_after_warm_up(model_dir, monkeypatch):
    from kaiyuan_recipes.serve.engine import Request, Sampling

    torch._dynamo.utils.counters.clear()
    engine = engine_for(model_dir, torch.bfloat16)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # the step, compiled once, at warm-up
    from kaiyuan_recipes.serve.batch_decoder import STEP_KINDS

    graphs = len(engine.decoder.batch_buckets) * len(engine.envelope.length_buckets) * len(STEP_KINDS)
    assert engine.decoder.captures == len(engine.decoder.graphs) == graphs == 4 * 3 * 3  # batch 2..16, 256..1024
    captures = []
    original = torch.cuda.CUDAGraph.capture_begin
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin",
                        lambda self, *a, **k: (captures.append(1), original(self, *a, **k))[1])
    torch._dynamo.utils.counters.clear()
    sampled = [Sampling(), Sampling(0.8, top_p=0.95), Sampling(1.2, top_k=20, seed=3), Sampling(1.0, seed=9)]
    for round_, (count, kinds) in enumerate(((1, 4), (3, 1), (16, 4), (40, 4), (7, 2), (9, 1))):
        batch = prompts(count, round_)
        done = engine.generate([Request(p, 1 + (i * 37) % 200, sampled[[0, 3, 1, 2][i % kinds]], ignore_eos=True)
                                for i, p in enumerate(batch)])
        assert [len(c.token_ids) for c in done] == [1 + (i * 37) % 200 for i in range(count)]
    assert captures == [] and engine.decoder.captures == graphs
    assert not torch._dynamo.utils.counters["stats"], dict(torch._dynamo.utils.counters["stats"])
    assert engine.stats["max_batch"] == 16
    engine.close()


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "graph"])
def test_captured_greedy_equals_generate_in_fp32(model_dir, compile):
    from transformers import AutoModelForCausalLM

    from kaiyuan_recipes.serve.engine import Request

    engine = engine_for(model_dir, torch.float32, compile=compile)
    batch = prompts(12, 7)
    got = [c.token_ids for c in engine.generate([Request(p, 64, ignore_eos=True) for p in batch])]
    engine.close()
    ref_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).cuda().eval()
    for prompt, tokens in zip(batch, got):
        ids = torch.tensor([prompt], device="cuda")
        ref = ref_model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False,
                                 pad_token_id=151643, disable_compile=True)[0, len(prompt):].tolist()
        assert tokens == ref


def test_captured_steps_give_the_eager_steps_tokens_in_fp32(model_dir):
    """Greedy and seeded sampled rows (temperature, top-k, top-p): a replayed graph reads the rows' settings,
    positions and tokens from the same buffers the eager step does, so the tokens are the same."""
    from kaiyuan_recipes.serve.engine import Request, Sampling

    batch = prompts(10, 11)
    settings = [Sampling() if i % 2 else Sampling(1.1, top_k=100 if i % 4 else 0, top_p=0.9, seed=i)
                for i in range(len(batch))]
    results = []
    for capture in (True, False):
        engine = engine_for(model_dir, torch.float32, capture, compile=False)
        assert bool(engine.decoder.graphs) == capture
        results.append([c.token_ids for c in engine.generate([Request(p, 48, s, ignore_eos=True)
                                                              for p, s in zip(batch, settings)])])
        engine.close()
    assert results[0] == results[1]


@pytest.mark.parametrize("where", ["before", "inside"])
def test_a_compiled_step_that_fails_is_captured_eagerly_instead(model_dir, monkeypatch, where):
    """An inductor (or Triton) failure at warm-up leaves graph mode, not eager decoding: the eager step is
    captured in its place (bucket of 1 again, the count of graphs its own), and greedy rows still equal generate
    in fp32. Before: the compiled layer fails on its first, uncaptured run. Inside: it fails only under capture,
    with a host sync that CUDA refuses there, so the capture is invalidated and torch.cuda.graph's exit fails."""
    from transformers import AutoModelForCausalLM

    from kaiyuan_recipes.serve.batch_decoder import STEP_KINDS
    from kaiyuan_recipes.serve.engine import Request

    def failing_compile(fn, **kwargs):
        def compiled(layer, *args, **kw):
            if where == "before":
                raise RuntimeError("inductor failed (this test's stand-in)")
            if torch.cuda.is_current_stream_capturing():
                args[0].sum().item()  # a sync under capture: CUDA invalidates the capture
            return fn(layer, *args, **kw)
        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    engine = engine_for(model_dir, torch.float32, compile=True)
    try:
        decoder = engine.decoder
        assert decoder.mode == "graph" and decoder.compiled == "nothing" and decoder.batch_buckets[0] == 1
        graphs = len(decoder.batch_buckets) * len(engine.envelope.length_buckets) * len(STEP_KINDS)
        assert len(decoder.graphs) == decoder.captures == graphs
        prompt = prompts(1, seed=3)[0]
        ours = engine.generate([Request(prompt, 24, ignore_eos=True)])[0].token_ids
    finally:
        engine.close()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).cuda().eval()
    expected = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=24, min_new_tokens=24,
                              do_sample=False, pad_token_id=151643, disable_compile=True)[0, len(prompt):].tolist()
    assert ours == expected
