"""Each compat workaround: it works, and a test that fails once upstream fixes the defect (so the
workaround can be deleted). Upstream behaviour is probed in fresh subprocesses, without compat."""

import importlib.metadata
import json
import subprocess
import sys
import textwrap

import pytest

from kaiyuan_recipes import compat

needs_no_te = pytest.mark.skipif(compat.transformer_engine_available(), reason="defect only shows without TE")


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


@needs_no_te
def test_upstream_megatron_bridge_import_still_needs_transformer_engine():
    """megatron-bridge 0.6.2 (peft/lora_layers.py) and 0.5.0 (peft/lora.py as well) import TE at module level, and
    `import megatron.bridge` reaches them: it fails in a module that compat.te_importing_modules() found."""
    found = compat.te_importing_modules()
    assert found, "no megatron-bridge LoRA module imports TE at module level: delete compat.install_lora_placeholder"
    probe = run_python("""
        import traceback, sys
        try:
            import megatron.bridge
        except ImportError as err:
            print("failed in", traceback.extract_tb(err.__traceback__)[-1].filename, err.name)
        """)
    assert probe.returncode == 0, probe.stderr[-2000:]
    modules = {m.replace(".", "/") + ".py" for m in found}
    last = probe.stdout.strip().splitlines()[-1] if probe.stdout.strip() else "imported"
    assert last.startswith("failed in") and last.endswith("transformer_engine"), last
    assert any(last.split()[2].endswith(m) for m in modules), (last, sorted(modules))


@needs_no_te
def test_lora_placeholder_lets_bridge_import_and_refuses_lora():
    probe = run_python(
        """
        from kaiyuan_recipes import compat
        compat.apply()
        import megatron.bridge
        from megatron.bridge.training.config import ConfigContainer
        from megatron.bridge.peft.lora_layers import LoRALinear
        try:
            LoRALinear()
        except compat.LoRAUnavailableError as err:
            print("refused:", err)
        """
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    version = importlib.metadata.version("megatron-bridge")
    assert f"refused: LoRALinear: LoRA in megatron-bridge {version} needs Transformer Engine" in probe.stdout


def test_upstream_compile_helpers_still_fails_on_the_wheel():
    if not compat.dataset_helpers_prebuilt():
        pytest.skip("helpers_cpp not prebuilt here")
    probe = run_python("from megatron.core.datasets.utils import compile_helpers; compile_helpers()")
    output = probe.stdout + probe.stderr
    failed_for_the_makefile = "no makefile found" in output and "Failed to compile the C++ dataset helper" in output
    assert probe.returncode != 0 and failed_for_the_makefile, (
        "compile_helpers() no longer fails for want of a Makefile: delete compat.skip_prebuilt_helpers_build")


def test_compile_helpers_skipped_when_prebuilt():
    probe = run_python(
        """
        from kaiyuan_recipes import compat
        compat.import_megatron_bridge()
        import megatron.bridge.training.initialize as init
        import megatron.core.datasets.utils as utils
        assert init.compile_helpers is utils.compile_helpers
        init.compile_helpers()
        from megatron.core.datasets import helpers_cpp
        print("ok", callable(helpers_cpp.build_sample_idx_int32))
        """
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert "ok True" in probe.stdout


# Two phases of one curriculum as the phase module sets them (data/phase_module.py): each stops at its own
# train_iters, both share the schedule of the curriculum's last iteration (100).
_PHASE_ITERS = (60, 100)
_CURRICULUM_SCHEDULE = {"lr_decay_style": "WSD", "max_steps": 100, "lr_decay_iters": 100, "lr_wsd_decay_iters": 40}
_WEIGHT_DECAY_ROW = next(r for r in compat.WORKAROUNDS if r.function == "size_weight_decay_by_max_steps")


def bridge_has_the_weight_decay_defect() -> bool:
    """Where the table says megatron-bridge sizes weight decay by train_iters (its versions column)."""
    return importlib.metadata.version("megatron-bridge") in _WEIGHT_DECAY_ROW.versions.split(", ")


def test_upstream_weight_decay_schedule_still_ignores_max_steps():
    """Upstream's ConfigContainer._calculate_scheduler_steps, without our patch, for two phases of one schedule:
    megatron-bridge 0.5.0 has no scheduler.max_steps and sizes wd_incr_steps by each phase's train_iters (60 and
    100 iterations of 16), so phase 2 cannot resume phase 1's scheduler; 0.6.2 sizes it by max_steps. Fails when
    a version of the table gains max_steps (drop it from the row), or another version shows the defect (add it)."""
    probe = run_python(f"""
        import dataclasses, json, types
        from kaiyuan_recipes import compat
        compat.install_lora_placeholder()  # to import megatron.bridge; nothing else of compat
        from megatron.bridge.training.config import ConfigContainer, SchedulerConfig, TrainingConfig
        totals = []
        for iters in {_PHASE_ITERS!r}:
            probe = types.SimpleNamespace(
                train=TrainingConfig(train_iters=iters, global_batch_size=16, micro_batch_size=4),
                scheduler=SchedulerConfig(lr_warmup_iters=20))
            for key, value in {_CURRICULUM_SCHEDULE!r}.items():
                setattr(probe.scheduler, key, value)  # as the phase module does, field or not
            ConfigContainer._calculate_scheduler_steps(probe)
            totals.append([probe.scheduler.wd_incr_steps, probe.scheduler.lr_decay_steps])
        fields = {{f.name for f in dataclasses.fields(SchedulerConfig)}}
        print(json.dumps({{"max_steps_field": "max_steps" in fields, "totals": totals}}))
        """)
    assert probe.returncode == 0, probe.stderr[-2000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    version = importlib.metadata.version("megatron-bridge")
    lr_decay_steps = [t[1] for t in seen["totals"]]
    assert lr_decay_steps == [100 * 16] * 2, seen  # the decay follows lr_decay_iters on every version
    if bridge_has_the_weight_decay_defect():
        assert not seen["max_steps_field"] and [t[0] for t in seen["totals"]] == [60 * 16, 100 * 16], (
            f"megatron-bridge {version} sizes weight decay by scheduler.max_steps now: drop {version} from "
            f"compat.size_weight_decay_by_max_steps's versions {seen}")
    else:
        assert seen["max_steps_field"] and [t[0] for t in seen["totals"]] == [100 * 16] * 2, (
            f"megatron-bridge {version} sizes weight decay by train_iters: add {version} to "
            f"compat.size_weight_decay_by_max_steps's versions {seen}")


def test_every_phase_gets_the_same_scheduler_totals_and_other_runs_keep_upstreams(tmp_path):
    """With compat, the resolved totals Megatron checks on resume (runtime_config_update, as pretrain runs it) are
    the same in both phases; a run without max_steps keeps upstream's weight decay (by its train_iters). On a
    Bridge without the defect the workaround is not applied at all."""
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import resolve_with_upstream

    compat.apply()
    from megatron.bridge.training.config import ConfigContainer

    totals = ("wd_incr_steps", "lr_decay_steps", "wsd_decay_steps", "lr_warmup_steps")
    resolved = []
    for iters in _PHASE_ITERS:
        cfg, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"])
        cfg.train.train_iters = iters
        for key, value in _CURRICULUM_SCHEDULE.items():
            setattr(cfg.scheduler, key, value)
        scheduler = resolve_with_upstream(cfg, world_size=1).scheduler
        resolved.append({key: getattr(scheduler, key) for key in totals})
    assert resolved[0] == resolved[1] == {"wd_incr_steps": 100 * 16, "lr_decay_steps": 100 * 16,
                                          "wsd_decay_steps": 40 * 16, "lr_warmup_steps": 20 * 16}, resolved
    plain, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock",
                                          "train.train_iters=60"])
    assert resolve_with_upstream(plain, world_size=1).scheduler.wd_incr_steps == 60 * 16
    patched = getattr(ConfigContainer._calculate_scheduler_steps, "_kaiyuan_patched", False)
    assert compat.size_weight_decay_by_max_steps() is patched is bridge_has_the_weight_decay_defect()


def test_upstream_distributed_optimizer_still_needs_state_before_load():
    """Upstream's DistributedOptimizer.state_dict() on a fresh torch AdamW (no step taken, as when a resume builds
    the optimizer and asks for its sharded state) still fails at its one-step assertion, without our patch."""
    from test_compat_adam_step import SHARD

    probe = run_python(SHARD + """
import sys, traceback
from megatron.core.optimizer import distrib_optimizer
if distrib_optimizer.HAVE_APEX_OR_TE:
    print("skip: Apex or TE"); sys.exit(0)
opt, _ = shard(0)
try:
    opt.state_dict()
    print("no error")
except AssertionError:
    print("asserted:", traceback.extract_tb(sys.exc_info()[2])[-1].line)
""")
    assert probe.returncode == 0, probe.stderr[-2000:]
    if "skip:" in probe.stdout:
        pytest.skip("defect only shows without Apex/TE")
    assert "asserted: assert len(steps) == 1" in probe.stdout, (
        "a fresh optimizer's state_dict() no longer asserts one step: re-check compat.init_optimizer_state_before_load")


def test_optimizer_state_is_initialised_only_for_a_load_of_an_empty_state():
    """Upstream's own initialiser, run on a real torch AdamW, gives the one 'step' state_dict() needs."""
    compat.apply()
    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    class Holder:  # the two attributes the initialiser touches
        _init_optimizer_states_with_dummy_values = DistributedOptimizer._init_optimizer_states_with_dummy_values

        def __init__(self):
            self.optimizer = torch.optim.AdamW(
                [torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(2, 3))])

    holder = Holder()
    assert compat.ensure_optimizer_state_for_load(holder, is_loading=False) is False
    assert not holder.optimizer.state
    assert compat.ensure_optimizer_state_for_load(holder, is_loading=True) is True
    steps = {float(s["step"]) for s in holder.optimizer.state_dict()["state"].values()}
    assert steps == {1.0}  # exactly what DistributedOptimizer.state_dict() asserts
    assert compat.ensure_optimizer_state_for_load(holder, is_loading=True) is False  # never twice
    assert DistributedOptimizer.sharded_state_dict._kaiyuan_patched


def test_upstream_defaults_still_enable_te_only_fusions():
    compat.apply()
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    probe = GPTModelProvider(num_layers=2, hidden_size=64, num_attention_heads=4)
    defaults = {k: getattr(probe, k) for k in compat.LOCAL_SPEC_SETTINGS}
    differing = {k for k, v in compat.LOCAL_SPEC_SETTINGS.items() if defaults[k] != v}
    assert differing == set(compat.LOCAL_SPEC_SETTINGS), (
        f"upstream defaults now match ours for {set(compat.LOCAL_SPEC_SETTINGS) - differing}: drop them from compat"
    )


_TE_WITHOUT_APEX = """
    import os, sys, types, torch
    from kaiyuan_recipes import compat
    compat.apply()
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import layers
    # Transformer Engine as Bridge's default sees it (an importable transformer_engine.pytorch), after megatron-core
    # has imported without it: the question is only what the default does with the output layer.
    te = types.ModuleType("transformer_engine"); te.pytorch = types.ModuleType("transformer_engine.pytorch")
    sys.modules.update({"transformer_engine": te, "transformer_engine.pytorch": te.pytorch})
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    default = GPTModelProvider.__dataclass_fields__["gradient_accumulation_fusion"].default_factory()
    config = ModelParallelConfig(gradient_accumulation_fusion=default, use_cpu_initialization=True)
    print("default:", config.gradient_accumulation_fusion)
    def output_layer():
        return layers.ColumnParallelLinear(16, 24, config=config, init_method=torch.nn.init.xavier_normal_, bias=False)
    try:
        output_layer(); print("upstream: built")
    except RuntimeError as err:
        print("upstream: refused", "fused_weight_gradient_mlp_cuda" in str(err))
    from kaiyuan_recipes.fastpath.apex_standins import torch_wgrad_accumulation
    print("workaround:", compat.wgrad_fusion_without_apex(config, standin=torch_wgrad_accumulation))
    output_layer(); print("after: built", config.gradient_accumulation_fusion)
"""


def test_upstream_te_default_still_breaks_the_output_layer_without_apex():
    """Bridge 0.6.2 defaults gradient_accumulation_fusion on where TE imports; megatron-core 0.19.2's
    ColumnParallelLinear (the GPT output layer, on the TE spec too) then refuses to build without Apex. With
    compat.wgrad_fusion_without_apex the same layer builds and keeps the fusion (torch's stand-in)."""
    import importlib.util

    if importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None:
        pytest.skip("Apex's extension is installed here: the defect cannot show")
    probe = run_python(_TE_WITHOUT_APEX)
    assert probe.returncode == 0, probe.stderr[-3000:]
    lines = probe.stdout.splitlines()
    assert "default: True" in lines, f"Bridge no longer turns the fusion on for TE alone: drop the workaround\n{lines}"
    assert "upstream: refused True" in lines, (
        f"megatron-core builds the output layer with the fusion and no Apex now: drop the workaround\n{lines}")
    assert "workaround: torch stand-in for fused_weight_gradient_mlp_cuda" in lines, lines
    assert lines[-1] == "after: built True", lines


needs_no_cuda = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch,sys; sys.exit(torch.cuda.is_available())"]).returncode != 0,
    reason="defect only shows on a host without CUDA")

_SAVE_ON_CPU = """
    import os, socket, sys, torch, torch.distributed as dist
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=0, world_size=1)
    {patch}
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor
    t = torch.arange(6, dtype=torch.float32)
    dist_checkpointing.save({{"w": ShardedTensor.from_rank_offsets("w", t)}}, sys.argv[1])
    back = dist_checkpointing.load({{"w": ShardedTensor.from_rank_offsets("w", torch.empty(6))}}, sys.argv[1])
    print("roundtrip", torch.equal(back["w"], t))
"""


def run_save_on_cpu(tmp_path, patch: str) -> subprocess.CompletedProcess:
    code = "if __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(_SAVE_ON_CPU.format(patch=patch)), "    ")
    script = tmp_path / "save_on_cpu.py"  # a file: the checkpoint writer spawns helper processes
    script.write_text(code)
    (tmp_path / "ckpt").mkdir()
    return subprocess.run([sys.executable, str(script), str(tmp_path / "ckpt")], capture_output=True, text=True,
                          timeout=300)


@needs_no_cuda
def test_upstream_torch_dist_save_still_needs_cuda(tmp_path):
    probe = run_save_on_cpu(tmp_path, "pass")
    assert probe.returncode != 0 and "NVIDIA driver" in probe.stderr, (
        "megatron-core saves torch_dist on a CPU host now: delete compat.cpu_checkpoint_save"
    )


@needs_no_cuda
def test_torch_dist_save_and_load_on_cpu_with_compat(tmp_path):
    probe = run_save_on_cpu(tmp_path, "from kaiyuan_recipes import compat; compat.cpu_checkpoint_save()")
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert "roundtrip True" in probe.stdout
    assert (tmp_path / "ckpt" / ".metadata").is_file()


@needs_no_cuda
def test_upstream_bridge_rng_state_still_reads_cuda():
    """Megatron-Bridge's get_rng_state, called as its saver calls it on a host without CUDA (gloo, one rank),
    still asks torch for the CUDA generator's state and fails there, without our module view."""
    probe = run_python(
        """
        import os, sys, traceback, torch
        from kaiyuan_recipes import compat
        compat.install_lora_placeholder()  # to import megatron.bridge; nothing else of compat
        from megatron.core import parallel_state
        from megatron.core.process_groups_config import ProcessGroupCollection
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
        parallel_state.initialize_model_parallel()
        from megatron.bridge.training import checkpointing
        try:
            pgs = ProcessGroupCollection.use_mpu_process_groups()
            checkpointing.get_rng_state(False, "torch_dist", pg_collection=pgs)
            print("no error")
        except RuntimeError as err:
            frames = [f.name for f in traceback.extract_tb(err.__traceback__)]
            print("raised in", "get_rng_state" in frames and "_lazy_init" in frames, "NVIDIA driver" in str(err))
        """
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip().splitlines()[-1] == "raised in True True", (
        "get_rng_state no longer reads the CUDA generator on a CPU host: drop it from compat's "
        "_CHECKPOINT_SAVE_MODULES " + probe.stdout[-500:])


def test_upstream_still_captures_the_final_evaluation_in_the_deleted_training_graphs_pool():
    """What compat.separate_full_graph_pools works around: after Bridge's end-of-training _delete_cuda_graphs
    the shared pool handle of the deleted training graph is still what the next (validation) capture gets.
    Fails once upstream releases or renews the handle with the graph (then drop the workaround)."""
    compat.apply()
    from megatron.bridge.training import train
    from megatron.core import full_cuda_graph

    stale_pool = ("pool of the training graph",)
    graphs = dict(full_cuda_graph.FullCudaGraphWrapper.cuda_graph)
    saved_pool = full_cuda_graph._shared_graph_pool
    try:
        full_cuda_graph.FullCudaGraphWrapper.cuda_graph.update(training=object(), validation=None)
        full_cuda_graph._shared_graph_pool = stale_pool
        train._delete_cuda_graphs(None)
        assert "training" not in full_cuda_graph.FullCudaGraphWrapper.cuda_graph  # the graph is gone ...
        assert full_cuda_graph.get_graph_pool(use_single_mempool=True) is stale_pool  # ... its pool handle is not
    finally:
        full_cuda_graph.FullCudaGraphWrapper.cuda_graph.clear()
        full_cuda_graph.FullCudaGraphWrapper.cuda_graph.update(graphs)
        full_cuda_graph._shared_graph_pool = saved_pool


def test_every_workaround_in_the_table_exists_and_names_a_test_that_exists():
    """compat.WORKAROUNDS: each row's function is in compat, and its probe test exists in the named file."""
    import ast
    from pathlib import Path

    tests = Path(__file__).parent
    exported = set(compat.__all__)
    for row in compat.WORKAROUNDS:
        assert row.function in exported and callable(getattr(compat, row.function)), row.function
        file, name = row.test.split("::")
        defined = {n.name for n in ast.walk(ast.parse((tests / file).read_text())) if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"{row.function}: {row.test} does not exist"



def test_upstream_pretrain_still_imports_resiliency_ext_unconditionally():
    """megatron-bridge's training/pretrain.py imports nvidia_resiliency_ext at module level (this environment has no
    nvidia-resiliency-ext: its wheels need glibc >= 2.39), so `pretrain` cannot be imported, and training cannot
    start, without compat.install_resiliency_placeholder. Fails once upstream makes the import optional."""
    assert compat.pretrain_imports_resiliency(), "pretrain no longer imports nvidia_resiliency_ext at module level: " \
        "delete compat.install_resiliency_placeholder"
    probe = run_python("""
        from kaiyuan_recipes import compat
        compat.install_lora_placeholder()  # to import megatron.bridge; nothing else of compat
        try:
            import megatron.bridge.training.pretrain
        except ImportError as err:
            print("failed:", err.name)
        else:
            print("imported")
        """)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip().splitlines()[-1] == "failed: nvidia_resiliency_ext"


def test_with_the_resiliency_placeholder_pretrain_imports_and_what_needs_the_package_refuses():
    probe = run_python("""
        import json
        from kaiyuan_recipes import compat
        compat.apply()
        from megatron.bridge.training.pretrain import pretrain  # noqa: F401
        from megatron.bridge.utils.import_utils import safe_import
        seen = {"optional_probe_sees_it_absent": not safe_import("nvidia_resiliency_ext.checkpointing")[1]}
        from nvidia_resiliency_ext.inprocess import CallWrapper
        for name, use in (("CallWrapper", lambda: CallWrapper()),
                          ("Wrapper", lambda: __import__("nvidia_resiliency_ext.inprocess").inprocess.Wrapper)):
            try:
                use()
            except compat.ResiliencyUnavailableError as err:
                seen[name] = str(err)
        seen["installed"] = compat.resiliency_placeholder_installed()
        print(json.dumps(seen))
        """)
    assert probe.returncode == 0, probe.stderr[-2000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["optional_probe_sees_it_absent"] and seen["installed"]
    assert "inprocess.CallWrapper: nvidia-resiliency-ext is not installed" in seen["CallWrapper"]
    assert "inprocess.Wrapper: nvidia-resiliency-ext is not installed" in seen["Wrapper"]
    assert "Pretraining works without them" in seen["Wrapper"]


def test_the_compat_page_names_every_workaround():
    """docs/compat.md lists each WORKAROUNDS row by its function name (a new workaround documented for users)."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "compat.md").read_text()
    assert [w.function for w in compat.WORKAROUNDS if f"`{w.function}`" not in page] == []


def test_upstream_num_epochs_still_loops_forever_on_an_empty_split():
    """megatron-core's own GPTDataset._get_num_epochs (under compat.refuse_an_empty_split) with a split of 0 tokens
    asked for samples: still running 10 s after the call, in a fresh interpreter. Once it returns or raises, the
    workaround can go."""
    probe = textwrap.dedent("""
        import types
        from kaiyuan_recipes import compat
        compat.apply()
        from megatron.core.datasets.gpt_dataset import GPTDataset
        original = GPTDataset._get_num_epochs.__wrapped__
        split = types.SimpleNamespace(num_samples=192, config=types.SimpleNamespace(
            sequence_length=4096, add_extra_token_to_sequence=True))
        print("calling", flush=True)
        print("epochs", original(split, 0), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert "calling\n" in iter(proc.stdout.readline, "")  # past upstream's import-time output
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait()
