"""A training worker's console: upstream's start-up noise goes to the full log in the run's logs/ only, through the
real logging set-up a worker runs (training/run_logging.py, as training/entry.py calls it) and the real upstream
loggers and functions that emit it. Each case runs in a fresh interpreter: logging is process-wide, and the order
of imports (Megatron's basicConfig, Bridge's import-time probes) is part of what is tested."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WORKER = textwrap.dedent("""
    import logging, sys
    from pathlib import Path
    from kaiyuan_recipes.training import run_logging

    run_logging.quiet_upstream()                  # what entry.main does first
    from kaiyuan_recipes import compat
    compat.apply()                                # imports Megatron-Bridge: its import-time probes log here
    import megatron.training.training             # noqa: F401  Megatron's basicConfig (the root's console handler)
    # what `datasets` logs while Megatron's training module imports, on a host with JAX: after Megatron's console
    # handler exists, before the console's policy wraps it
    logging.getLogger("datasets").setLevel(logging.INFO)   # at INFO, as a worker's start showed it
    logging.getLogger("datasets").info("JAX version 0.0.0 available.")
    run_logging.quiet_console()                   # what entry.main does then, before it resolves the config
    # what a start on one GPU printed while resolving, before the run's full log exists
    logging.getLogger("megatron.core.datasets.blended_megatron_dataset_config").info("Let split_matrix = [early]")
    print(">>> done with dataset index builder. Compilation time: 0.000 seconds", flush=True)
    from kaiyuan_recipes.training.config import build_config
    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={sys.argv[1]}"])
    run_logging.start_console(cfg, run)          # what entry.main does once the run is known

    from megatron.bridge.utils.import_utils import safe_import_from
    from megatron.core.utils import log_single_rank
    # Bridge's optional-import probe, as peft/utils.py runs it at import (a symbol the module lacks)
    safe_import_from("megatron.core.extensions.transformer_engine", "NoSuchSymbolForTheTest")
    buffers = logging.getLogger("megatron.core.distributed.param_and_grad_buffer")
    for _ in range(3):                            # once per bucket group, as _ParamAndGradBucketGroup logs it
        log_single_rank(buffers, logging.INFO,
                        "Using reduce-scatter for gradient reductions because use_distributed_optimizer=True")
    log_single_rank(buffers, logging.WARNING, "a warning from the buffers")
    datasets = logging.getLogger("megatron.core.datasets.gpt_dataset")
    for _ in range(2):                            # once per source of a blend: progress, shown each time
        log_single_rank(datasets, logging.INFO, "Build and save the GPTDataset train indices")
    optimizer = logging.getLogger("megatron.core.optimizer")
    for _ in range(4):
        log_single_rank(optimizer, logging.INFO, "the same optimizer line")

    # what a start on one GPU printed before its first iteration (upstream's own set-up, records and warnings)
    logging.info("Using preset vocab_size: 151936 over the tokenizer vocab_size: 151643, dummy tokens: 293.")
    print("> initializing torch distributed ...", flush=True)
    print("time to initialize megatron (seconds): 12.345", flush=True)
    print("> setting tensorboard ...", flush=True)
    print(" > number of parameters on (tensor, gtp_remat, pipeline) model parallel rank (0, 0, 0): 2031739904",
          flush=True)
    for line in (" > datasets target sizes (minimum size):", "    train:      20480", "    validation: 5120",
                 "    test:       5120", "done with setup ...", "Setting rerun_state_machine.current_iteration to 0...",
                 "Starting training loop at iteration 0"):
        print(line, flush=True)
    from megatron.training.utils.common_utils import warn_rank_0
    warn_rank_0("full scope is deprecated. Use empty cuda_graph_modules to capture the whole layer.", rank=0)
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
    try:
        build_tokenizer(cfg.tokenizer)                # warns that it is deprecated, then builds
    except Exception:
        pass
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
    dist.barrier()                                # c10d: "barrier(): using the device under current context"
    dist.destroy_process_group()
    logging.getLogger("kaiyuan_recipes.training").info("our own record")

    from kaiyuan_recipes.training.validate import resolve_with_upstream
    resolve_with_upstream(cfg, 1).log_non_default_values()   # Bridge's Configuration Summary (a print)
    print("after the summary", flush=True)

    import warnings
    from megatron.bridge.utils.decorators import experimental_fn
    experimental_fn(lambda: None)()               # what calling Bridge's pretrain warns
    warnings.warn("a warning about this run")     # raised while running, not importing: shown
    # upstream's notices at every start (megatron_dataset.py for Qwen2's pad id, autograd under Megatron's schedule)
    warnings.warn("The pad token id in the tokenizer collides with another special token id. This may cause "
                  "instability and lack of covergence during training. As such, the training flow will avoid masking "
                  "out any pad tokens already present in the dataset. If you would like to disable this behavior, ...")
    warnings.warn("The pad token id in the tokenizer collides with another special token id. This may cause "
                  "instability and lack of covergence during training. Do not ignore this warning if you do not "
                  "understand the implications. ")     # dataset.allow_ambiguous_pad_tokens=true: about the run
    warnings.warn("The AccumulateGrad node's stream does not match the stream of the node that produced the ...")

    # how a run ends: Bridge's own _pretrain around a train() that exits 0 after a stop's checkpoint, then around
    # a set-up that fails
    from megatron.bridge.training import pretrain as bridge_pretrain
    from megatron.bridge.training.state import GlobalState

    def ends(error):
        def setup(*args, **kwargs):
            raise error
        return setup

    for error in (SystemExit(0), RuntimeError("a set-up that fails")):
        bridge_pretrain.setup = ends(error)
        state = GlobalState()
        state.cfg = cfg
        try:
            bridge_pretrain._pretrain(state, forward_step_func=lambda *args: None)
        except BaseException:
            pass
""")


def run_worker(tmp_path: Path, verbose: bool) -> tuple[str, str]:
    env = {**os.environ, "RANK": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("KAIYUAN_VERBOSE", None)
    if verbose:
        env["KAIYUAN_VERBOSE"] = "1"
    from conftest import free_port

    done = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), str(free_port())], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    full = tmp_path / "gpt_smoke" / "logs" / "upstream.rank0.log"
    return done.stdout + done.stderr, full.read_text()


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    return run_worker(tmp_path_factory.mktemp("quiet"), verbose=False)


def test_console_leaves_out_upstream_noise(quiet):
    console, _ = quiet
    assert "Import of " not in console  # the optional-import probes, with their tracebacks
    assert console.count("Traceback") == 1  # the one of the set-up that fails, at the end
    assert "Using reduce-scatter" not in console
    assert "Configuration Summary" not in console
    assert "after the summary" in console  # other prints go on
    assert "warnings.warn" not in console and "is experimental" not in console  # import-time and API notices
    for upstream in ("JAX version", "Let split_matrix", ">>> done with dataset index builder",
                     "Using preset vocab_size", "> initializing torch distributed", "time to initialize megatron",
                     "> setting tensorboard", "full scope is deprecated", "is deprecated", "barrier()",
                     "the same optimizer line", "number of parameters on", "datasets target sizes", "train:  ",
                     "validation: ", "done with setup", "Setting rerun_state_machine", "Starting training loop",
                     "avoid masking out any pad tokens", "AccumulateGrad node's stream", "SystemExit: 0"):
        assert upstream not in console, upstream


def test_import_time_warnings_go_to_the_full_log_and_later_ones_stay_on_the_console(quiet):
    console, full = quiet
    assert "UserWarning: a warning about this run" in console
    assert "Do not ignore this warning if you do not understand the implications" in console
    assert "is experimental" in full
    from kaiyuan_recipes import compat

    if not compat.transformer_engine_available():  # Megatron's modules warn at import on a host without TE / Apex
        assert "are not installed" not in console and "are not installed. Falling back" in full
        # and GPTModelProvider's default probe warns at each construction; the run decides the fusion itself
        assert "gradient_accumulation_fusion requires" not in console
        assert "gradient_accumulation_fusion requires" in full
    assert "Gemma2: " not in console


def test_console_keeps_what_a_person_needs(quiet):
    console, _ = quiet
    assert "a warning from the buffers" in console  # a quiet logger's warnings are not quiet
    assert "Pretrain failed on rank=0 with RuntimeError: a set-up that fails" in console  # a real failure
    assert "our own record" in console
    assert console.count("Build and save the GPTDataset train indices") == 2  # set-up progress, per source
    decided = [line for line in console.splitlines() if line.startswith("kaiyuan: ")]
    assert any(line.startswith("kaiyuan: recipe gpt_smoke") for line in decided)
    assert any(line.startswith("kaiyuan: data bundled sample corpus") for line in decided)
    assert any("layer spec" in line for line in decided) and any("fast path" in line for line in decided)


def test_full_log_has_everything(quiet):
    _, full = quiet
    assert "Import of NoSuchSymbolForTheTest" in full and "Traceback" in full
    assert full.count("Using reduce-scatter for gradient reductions") == 3
    assert full.count("Build and save the GPTDataset train indices") == 2
    assert full.count("the same optimizer line") == 4
    for upstream in ("JAX version", "Let split_matrix = [early]", ">>> done with dataset index builder",
                     "Using preset vocab_size", "> initializing torch distributed", "time to initialize megatron",
                     "> setting tensorboard", "full scope is deprecated", "`build_tokenizer` is deprecated",
                     "number of parameters on", "datasets target sizes", "Starting training loop",
                     "pad token id in the tokenizer collides"):
        assert upstream in full, upstream
    # Bridge reports a clean exit as a failure (the console rule for it goes once this fails)
    assert "Pretrain failed on rank=0 with SystemExit: 0" in full
    assert "Configuration Summary (Non-Default Values vs Megatron Core)" in full
    from kaiyuan_recipes import compat

    if not compat.transformer_engine_available():  # without TE, Bridge probes FP8GlobalStateManager at import
        assert "Import of FP8GlobalStateManager" in full


def test_verbose_shows_everything_on_the_console(tmp_path):
    console, full = run_worker(tmp_path, verbose=True)
    assert "Import of NoSuchSymbolForTheTest" in console
    assert console.count("Using reduce-scatter for gradient reductions") >= 3
    assert "Configuration Summary" in console
    assert "Using reduce-scatter for gradient reductions" in full


def test_progress_line_names_every_figure():
    from kaiyuan_recipes.training.run_logging import progress_line

    line = progress_line(iteration=20, total=1000, loss=9.87654, lr=3e-4, tokens_per_s=64_000.0, gpus=2,
                         tflops_per_gpu=412.34, peak_mem_gb=61.25, seconds_per_step=2.0)
    assert line == ("kaiyuan: iteration 20/1,000 | loss 9.8765 | lr 3.000e-04 | 64,000 tokens/s (32,000/GPU) | "
                    "412.3 TFLOP/s/GPU | peak mem 61.2 GB | ETA 32m 40s")
