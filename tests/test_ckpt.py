"""`kaiyuan ckpt ls | inspect | verify | diff` on real checkpoints written on this CPU host by the trainer's own
save path: gpt_smoke's ConfigContainer from build_config, the model from the provider (Float16Module), megatron-core
DDP and the distributed optimizer (ZeRO 1) from Bridge's setup_optimizer, real optimizer steps, and Bridge's
save_checkpoint (run_config.yaml, train_state.pt, the tracker, keep-last-K cleanup). `kaiyuan train` itself cannot
run here (Bridge's pretrain imports nvidia_resiliency_ext and needs CUDA), so the writer drives those pieces the
way pretrain does. Corrupt checkpoints are copies of real ones with one file deleted, truncated or overwritten."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kaiyuan_recipes.cli.main import main

REPO = Path(__file__).resolve().parent.parent
# gpt_smoke at a size the CPU trains and saves in seconds; mock data (the steps feed random tokens).
SMALL = ["model.num_layers=1", "model.hidden_size=64", "model.ffn_hidden_size=128", "model.num_attention_heads=4",
         "model.num_query_groups=2", "model.kv_channels=16", "model.vocab_size=1024", "model.seq_length=64",
         "dataset.seq_length=64", "train.global_batch_size=2", "train.micro_batch_size=1", "kaiyuan.data=mock"]
SEQ, GBS = 64, 2

WRITER = '''
import contextlib, json, os, socket, sys


def cpu_shims(torch):
    """The lines of megatron-core's DDP / distributed optimizer / GPT forward that name CUDA: buffers and
    scalars on the CPU, CUDA type names for the optimizer's dtype check, the causal mask and RNG fork local."""
    from megatron.core import tensor_parallel
    from megatron.core.fusions import fused_softmax

    torch.cuda.current_device = lambda: "cpu"

    def on_cpu(factory):
        return lambda *a, device=None, **k: factory(*a, device="cpu" if str(device).startswith("cuda") else device, **k)

    for name in ("tensor", "zeros", "ones", "empty", "full"):
        setattr(torch, name, on_cpu(getattr(torch, name)))
    _type = torch.Tensor.type
    torch.Tensor.type = lambda self, *a, **k: (_type(self, *a, **k) if a or k
                                               else _type(self).replace("torch.", "torch.cuda.", 1))
    fused_softmax.get_default_causal_mask = lambda sq: torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)
    tensor_parallel.get_cuda_rng_tracker().fork = contextlib.nullcontext


def setup(cfg):
    """Bridge's setup in one process: the model up to its DDP wrap (which opens a CUDA stream: provider,
    Float16Module, bf16 params), megatron-core DDP, setup_optimizer."""
    from megatron.bridge.training.optim import setup_optimizer
    from megatron.bridge.training.state import GlobalState
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.process_groups_config import ProcessGroupCollection

    chunks = cfg.model.provide_distributed_model(ddp_config=cfg.ddp, use_cpu_initialization=True, wrap_with_ddp=False,
                                                 pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    model = [DistributedDataParallel(config=cfg.model, ddp_config=cfg.ddp, module=m) for m in chunks]
    opt, sched = setup_optimizer(cfg.optimizer, cfg.scheduler, model)
    state = GlobalState()
    state.cfg = cfg
    return model, opt, sched, state


def resume(cfg):
    """Bridge's load_checkpoint of cfg.checkpoint.load into this process's layout; prints what it restored."""
    import torch.distributed as dist
    from megatron.bridge.training.checkpointing import load_checkpoint
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator

    model, opt, sched, state = setup(cfg)
    init_num_microbatches_calculator(dist.get_rank(), None, cfg.train.global_batch_size, cfg.train.micro_batch_size,
                                     dist.get_world_size())  # as Bridge's initialize does
    load_checkpoint(state, model, opt, sched)
    main = [p for g in opt.optimizer.param_groups for p in g["params"]]
    print("resumed", json.dumps({"iteration": state.train_state.step,
                                 "samples": state.train_state.consumed_train_samples,
                                 "main_params_sum": float(sum(p.detach().double().sum() for p in main))}))


def train_and_save(cfg, saves):
    """Bridge's train loop, reduced: steps (forward, backward, optimizer and scheduler step), and
    save_checkpoint at each iteration in `saves`."""
    import torch
    from megatron.bridge.training.checkpointing import save_checkpoint

    model, opt, sched, state = setup(cfg)
    gbs, seq = cfg.train.global_batch_size, cfg.dataset.seq_length
    gen = torch.Generator().manual_seed(0)
    for it in range(1, max(saves) + 1):
        for m in model:
            m.zero_grad_buffer()
        opt.zero_grad()
        tokens = torch.randint(0, cfg.model.vocab_size, (1, seq), generator=gen)
        loss = model[0](tokens, torch.arange(seq).unsqueeze(0), None, labels=tokens).float().mean()
        loss.backward()  # one DP rank: the gradient reduce-scatter is the identity (and needs CUDA streams)
        opt.step()
        sched.step(increment=gbs)
        state.train_state.step = it
        state.train_state.consumed_train_samples += gbs
        if it in saves:
            save_checkpoint(state, model, opt, sched, 0, checkpointing_context={})


def save_weights(cfg, out):
    """What tests/test_export_knobs.py writes: the model alone, with training's run_config.yaml."""
    import torch
    from megatron.bridge.training.model_load_save import save_megatron_model

    from kaiyuan_recipes.models.providers import provide_on_cpu
    from kaiyuan_recipes.fastpath import TRAINING_STEP_MODEL_FIELDS

    trained = {k: getattr(cfg.model, k) for k in TRAINING_STEP_MODEL_FIELDS}
    for key, value in TRAINING_STEP_MODEL_FIELDS.items():
        setattr(cfg.model, key, value)
    model = provide_on_cpu(cfg.model).to(torch.bfloat16)
    for key, value in trained.items():
        setattr(cfg.model, key, value)
    save_megatron_model([model], out)
    from pathlib import Path
    newest = max(Path(out).glob("iter_*"))
    cfg.to_yaml(str(newest / "run_config.yaml"))


def main(mode, run_root, saves, overrides):
    import torch
    import torch.distributed as dist

    from kaiyuan_recipes import compat

    compat.apply()
    compat.cpu_checkpoint_save()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # started by torchrun: data-parallel ranks
        dist.init_process_group("gloo")
    else:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import resolve_with_upstream

    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={run_root}"] + overrides)
    if mode in ("train", "resume"):
        cpu_shims(torch)
        resolved = resolve_with_upstream(cfg, world_size=world)  # the config pretrain runs with
        train_and_save(resolved, saves) if mode == "train" else resume(resolved)
    else:
        save_weights(cfg, run.layout.checkpoints)
    print("written", run.layout.checkpoints)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:])
'''


def write_run(tmp: Path, mode: str, name: str, saves: list[int], *overrides: str, ranks: int = 1) -> Path:
    script = tmp / "write_checkpoints.py"  # a file: the checkpoint writer starts helper processes
    script.write_text(textwrap.dedent(WRITER))
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc-per-node={ranks}"]
    proc = subprocess.run([*launch, str(script), mode, str(tmp / "runs"), json.dumps(saves),
                           f"kaiyuan.run_name={name}", *SMALL, *overrides], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if mode == "resume":
        return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("resumed "))[8:])
    return tmp / "runs" / name


@pytest.fixture(scope="session")
def zero1_run(tmp_path_factory):
    """Saves at 2, 4, 6 and 8 with the recipe's keep-last-3: Bridge's own cleanup has deleted iteration 2."""
    return write_run(tmp_path_factory.mktemp("ckpt"), "train", "zero1", [2, 4, 6, 8], "train.train_iters=8",
                     "checkpoint.save_interval=2", *NO_OVERLAP)


# Overlapped gradient reduction and parameter gather off: their hooks open CUDA streams (the saved state is alike).
NO_OVERLAP = ("ddp.overlap_grad_reduce=false", "ddp.overlap_param_gather=false")


@pytest.fixture(scope="session")
def dp2_run(tmp_path_factory):
    """Two data-parallel ranks (torchrun, gloo): each writes its shard of the distributed optimizer."""
    return write_run(tmp_path_factory.mktemp("ckpt"), "train", "dp2", [2, 4], "train.train_iters=4",
                     "checkpoint.save_interval=2", *NO_OVERLAP, ranks=2)


@pytest.fixture(scope="session")
def fast_weights(tmp_path_factory):
    """The fast spec with its defaults (graph and wgrad knobs recorded as training resolves them), weights only."""
    return write_run(tmp_path_factory.mktemp("ckpt"), "weights", "fast", [], "kaiyuan.layer_spec=fast")


def ckpt(capsys, *args):
    rc = main(["ckpt", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def ckpt_json(capsys, *args):
    rc, out, err = ckpt(capsys, *args, "--json")
    assert rc in (0, 1), err
    return rc, json.loads(out)


def test_ls_lists_each_save_with_its_progress_and_what_keep_last_k_deletes_next(zero1_run, capsys):
    from kaiyuan_recipes.ckpt.store import disk_bytes

    rc, listing = ckpt_json(capsys, "ls", zero1_run)
    assert rc == 0
    rows = listing["checkpoints"]
    assert [r["iteration"] for r in rows] == [4, 6, 8]  # Bridge removed iteration 2 at the save of 8
    assert listing["most_recent_k"] == 3 and listing["tracker_iteration"] == 8
    assert [r["latest"] for r in rows] == [False, False, True]
    assert listing["deleted_next"] == [4] and [r["deleted_next"] for r in rows] == [True, False, False]
    for r in rows:
        assert r["complete"] and r["format"] == "torch_dist" and r["has_optimizer"] is True
        assert r["consumed_samples"] == r["iteration"] * GBS
        assert r["consumed_tokens"] == r["iteration"] * GBS * SEQ
        assert r["disk_bytes"] == disk_bytes(Path(r["path"])) > 0
        assert r["saved_at"].endswith("+00:00")
    assert listing["notes"] == []
    assert ckpt_json(capsys, "ls", zero1_run / "checkpoints" / "iter_0000006")[1] == listing  # its run's
    rc, out, _ = ckpt(capsys, "ls", zero1_run)
    assert rc == 0 and "keep-last-K: 3" in out and "deleted by next save" in out and "latest" in out


@pytest.mark.parametrize("k", [3, 1])
def test_deleted_next_is_what_bridges_cleanup_deletes_at_the_next_save(zero1_run, tmp_path, k):
    from kaiyuan_recipes import compat

    compat.apply()  # what importing megatron.bridge needs on a host without TE
    from megatron.bridge.training.checkpointing import cleanup_old_non_persistent_checkpoint

    from kaiyuan_recipes.ckpt.listing import deleted_by_next_save, list_checkpoints

    root = tmp_path / "checkpoints"
    shutil.copytree(zero1_run / "checkpoints", root)
    listing = list_checkpoints(tmp_path)
    predicted = deleted_by_next_save([e.iteration for e in listing.checkpoints], k)
    shutil.copytree(root / "iter_0000008", root / "iter_0000010")  # the next save
    cleanup_old_non_persistent_checkpoint(str(root), leave_ckpt_num=k, do_async=False)
    left = sorted(int(p.name[5:]) for p in root.glob("iter_*"))
    assert sorted(set([4, 6, 8, 10]) - set(left)) == predicted
    assert listing.deleted_next == deleted_by_next_save([4, 6, 8], 3) == [4]


def test_inspect_reports_recipe_shape_knobs_layout_and_load_targets(zero1_run, capsys):
    rc, report = ckpt_json(capsys, "inspect", zero1_run, "--tensors", "linear_qkv")
    assert rc == 0 and report["iteration"] == 8 and report["format"] == "torch_dist"
    assert report["model"]["num_layers"] == 1 and report["model"]["hidden_size"] == 64
    assert report["recipe"] is None and "command.json" in report["recipe_source"]  # a shape no recipe ships
    knobs = report["knobs"]
    assert knobs["zero_stage"] == 1 and knobs["layer_spec"] == "local_layer_spec" and knobs["most_recent_k"] == 3
    assert knobs["global_batch_size"] == GBS and knobs["ckpt_format"] == "torch_dist"
    assert report["layout"] == {"tensor": 1, "pipeline": 1, "context": 1, "expert": 1, "data": 1, "zero_stage": 1,
                                "optimizer_sharding": "dp_reshardable", "writer_ranks": 1}
    assert report["loadable"]["resume_other_dp"] and not report["loadable"]["resume_other_tp_pp"]
    assert report["loadable"]["export_hf"]
    groups = {g["name"]: g for g in report["groups"]}
    params = report["model"]["parameters"]
    for state in ("optimizer.param", "optimizer.exp_avg", "optimizer.exp_avg_sq"):
        assert groups[state]["parameters"] == params and groups[state]["dtypes"] == ["float32"]  # fp32 main copy
    assert groups["decoder.layers.self_attention"]["dtypes"] == ["bfloat16"]
    assert groups["embedding"]["parameters"] == 1024 * 64
    qkv = {t["key"]: t for t in report["tensors"]}
    assert set(qkv) == {"decoder.layers.self_attention.linear_qkv.weight",
                        "decoder.layers.self_attention.linear_qkv.layer_norm_weight"}
    assert qkv["decoder.layers.self_attention.linear_qkv.weight"]["shape"] == [1, (4 + 2 * 2) * 16, 64]
    assert report["train_state"]["consumed_train_samples"] == 8 * GBS
    rc, out, _ = ckpt(capsys, "inspect", zero1_run / "checkpoints" / "iter_0000004")
    assert rc == 0 and "dp_reshardable" in out and "optimizer.exp_avg" in out and "4  (consumed samples 8)" in out


def test_inspect_fast_spec_weights_only_checkpoint(fast_weights, capsys):
    import yaml

    from kaiyuan_recipes.ckpt.store import resolve_checkpoint

    rc, report = ckpt_json(capsys, "inspect", fast_weights)
    assert rc == 0
    recorded = yaml.safe_load((resolve_checkpoint(fast_weights) / "run_config.yaml").read_text())["model"]
    assert report["knobs"]["layer_spec"] != "local_layer_spec"
    assert report["knobs"]["cuda_graph_impl"] == recorded["cuda_graph_impl"]
    assert report["knobs"]["gradient_accumulation_fusion"] == recorded["gradient_accumulation_fusion"]
    assert not any(g["name"].startswith("optimizer.") for g in report["groups"])
    assert report["layout"]["optimizer_sharding"] is None
    assert report["loadable"] == {"resume_other_dp": True, "resume_other_tp_pp": True, "export_hf": True,
                                  "reasons": report["loadable"]["reasons"]}
    _, listing = ckpt_json(capsys, "ls", fast_weights)
    assert [r["has_optimizer"] for r in listing["checkpoints"]] == [False]


def test_verify_reads_every_shard_and_tensor(zero1_run, capsys):
    rc, report = ckpt_json(capsys, "verify", zero1_run)
    assert rc == 0 and report["ok"] and report["problems"] == [] and report["nonfinite"] == []
    assert report["tensors_checked"] > 10 and report["objects_checked"] > 0
    assert report["bytes_read"] == sum(f["expected_bytes"] for f in report["files"])
    assert all(f["actual_bytes"] == f["expected_bytes"] for f in report["files"])
    rc, out, _ = ckpt(capsys, "verify", zero1_run)
    assert rc == 0 and ": ok (torch_dist;" in out


def damaged_copy(zero1_run, tmp_path):
    from kaiyuan_recipes.ckpt.store import read_dcp_metadata

    copy = tmp_path / "iter_0000008"
    shutil.copytree(zero1_run / "checkpoints" / "iter_0000008", copy)
    shard = sorted(copy.glob("*.distcp"))[0]
    return copy, shard, read_dcp_metadata(copy)


def test_verify_names_a_missing_shard(zero1_run, tmp_path, capsys):
    copy, shard, _ = damaged_copy(zero1_run, tmp_path)
    shard.unlink()
    rc, out, err = ckpt(capsys, "verify", copy)
    assert rc == 1 and f"kaiyuan: error: {shard}: missing (the metadata places" in err
    rc, report = ckpt_json(capsys, "verify", copy)
    assert rc == 1 and not report["ok"] and report["problems"][0]["file"] == str(shard)


def test_verify_names_a_truncated_shard(zero1_run, tmp_path, capsys):
    copy, shard, _ = damaged_copy(zero1_run, tmp_path)
    full = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(full // 2)
    rc, out, err = ckpt(capsys, "verify", copy)
    assert rc == 1 and f"kaiyuan: error: {shard}: truncated: {full // 2:,} bytes, its items need {full:,}" in err


def test_verify_names_a_garbled_tensor_and_its_file(zero1_run, tmp_path, capsys):
    copy, shard, metadata = damaged_copy(zero1_run, tmp_path)
    key = "decoder.layers.mlp.linear_fc2.weight"
    info = next(i for idx, i in metadata.storage_data.items() if idx.fqn == key)
    with open(copy / info.relative_path, "r+b") as f:  # same size, its bytes overwritten
        f.seek(info.offset)
        f.write(b"\0" * 64)
    rc, out, err = ckpt(capsys, "verify", copy)
    assert rc == 1 and f"kaiyuan: error: {copy / info.relative_path}: {key}: does not load" in err


def test_bad_paths_are_named_with_what_was_expected(zero1_run, tmp_path, capsys):
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    for command in ("ls", "inspect", "verify"):
        rc, _, err = ckpt(capsys, command, tmp_path / "empty_run")
        assert rc == 2 and f"{tmp_path / 'empty_run' / 'checkpoints'}: no iter_* checkpoint directories" in err
    rc, _, err = ckpt(capsys, "inspect", tmp_path / "nowhere")
    assert rc == 2 and f"{tmp_path / 'nowhere'}: does not exist" in err
    half = tmp_path / "iter_0000009"  # a save killed before DCP wrote its metadata
    half.mkdir()
    rc, _, err = ckpt(capsys, "verify", half)
    assert rc == 2 and f"{half}: no .metadata" in err
    copy, _, _ = damaged_copy(zero1_run, tmp_path)
    (copy / ".metadata").write_bytes(b"not a pickle")
    rc, _, err = ckpt(capsys, "inspect", copy)
    assert rc == 2 and f"{copy / '.metadata'}: unreadable as torch.distributed.checkpoint metadata" in err


def full_state(path):
    """Every tensor of a checkpoint in memory, through DCP's plain whole-checkpoint load (the reference)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return state


def test_diff_of_two_saves_per_tensor_and_grouped(zero1_run, capsys):
    a, b = zero1_run / "checkpoints" / "iter_0000006", zero1_run / "checkpoints" / "iter_0000008"
    rc, report = ckpt_json(capsys, "diff", a, b)
    assert rc == 1 and not report["identical"]
    ref_a, ref_b = full_state(a), full_state(b)
    for t in report["tensors"]:  # the chunked reading agrees with whole-tensor arithmetic
        x, y = ref_a[t["key"]].float(), ref_b[t["key"]].float()
        assert t["max_abs"] == pytest.approx(float((x - y).abs().max()), rel=1e-6), t["key"]
        assert t["rel_norm"] == pytest.approx(float((x - y).norm() / x.norm()) if x.norm() else float((x - y).norm()),
                                              rel=1e-4, abs=1e-9), t["key"]
        assert t["equal"] == bool((x == y).all())
    groups = {g["name"]: g for g in report["groups"]}
    assert groups["optimizer.exp_avg"]["differ"] == 1 and groups["optimizer.exp_avg"]["rel_norm"] > 0
    assert groups["decoder.final_layernorm"]["keys"] == 1
    assert groups["common_state"]["differ"] == 1  # the iteration and the scheduler's step count
    assert groups["rng_state"]["differ"] == 0 and report["only_in_a"] == report["only_in_b"] == []
    # megatron-core 0.19 stores the common state inside the DCP files; 0.18 in common.pt beside them
    common = next(o for o in report["objects"] if o["key"].startswith("common_state/") or o["key"] == "common.pt")
    rc, out, _ = ckpt(capsys, "diff", a, b)
    assert rc == 1 and "optimizer.exp_avg" in out and "they differ" in out
    assert f"{common['key']} differs (A -> B):" in out
    assert any(c.endswith("iteration: 6 -> 8") for c in common["changes"]), common["changes"]
    assert any(c.endswith("opt_param_scheduler.num_steps: 12 -> 16") for c in common["changes"])  # GBS per step
    rc, out, _ = ckpt(capsys, "diff", b, b)
    assert rc == 0 and out.rstrip().endswith("identical")


def test_region_reads_reshard_to_any_piece(zero1_run):
    """What diff relies on when B was saved with another chunking: DCP fills any region from the stored chunks."""
    import torch

    from kaiyuan_recipes.ckpt.regions import Region, load_region, stored_regions
    from kaiyuan_recipes.ckpt.store import read_dcp_metadata

    path = zero1_run / "checkpoints" / "iter_0000008"
    metadata, full = read_dcp_metadata(path), full_state(path)
    key = next(k for k in full if k.endswith("exp_avg"))
    assert len(stored_regions(key, metadata.state_dict_metadata[key])) > 1  # one chunk per parameter range
    n = full[key].numel()
    piece = load_region(path, Region(key, (n // 3,), (n // 2,)), torch.float32, metadata)
    assert torch.equal(piece, full[key][n // 3: n // 3 + n // 2])
    key = "decoder.layers.mlp.linear_fc1.weight"  # two stored chunks (the gate and up halves)
    piece = load_region(path, Region(key, (0, 100, 3), (1, 100, 20)), torch.bfloat16, metadata)
    assert torch.equal(piece, full[key][:, 100:200, 3:23])


def test_gpu_diagnosis_script_calls_the_package(zero1_run, tmp_path):
    a, b = zero1_run / "checkpoints" / "iter_0000006", zero1_run / "checkpoints" / "iter_0000008"
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "ckpt_diff.py"), str(a), str(b),
                           "--out", str(tmp_path / "diff.json")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {"optimizer.exp_avg", "common_state"} <= {next(iter(line)) for line in lines}
    saved = json.loads((tmp_path / "diff.json").read_text())
    assert saved["a"] == str(a) and not saved["identical"]


def test_a_dp2_checkpoint_says_dp2_and_resumes_on_one_rank_as_inspect_promises(dp2_run, tmp_path, capsys):
    rc, report = ckpt_json(capsys, "inspect", dp2_run)
    assert rc == 0 and report["layout"]["writer_ranks"] == 2 and report["layout"]["data"] == 2
    assert report["loadable"]["resume_other_dp"]
    # Bridge's own load_checkpoint, into one rank (RNG left out: this host has no CUDA generator to restore).
    resumed = write_run(tmp_path, "resume", "dp2", [], f"checkpoint.load={dp2_run / 'checkpoints'}",
                        "train.train_iters=4", "checkpoint.save_interval=2", "checkpoint.load_rng=false", *NO_OVERLAP)
    stored = full_state(dp2_run / "checkpoints" / "iter_0000004")
    main_params = next(v for k, v in stored.items() if k.endswith("bucket_idx_0.param"))
    assert resumed["iteration"] == 4 and resumed["samples"] == 4 * GBS
    assert resumed["main_params_sum"] == pytest.approx(float(main_params.double().sum()), rel=1e-12)


def test_verify_names_the_rank_file_that_is_damaged(dp2_run, tmp_path, capsys):
    copy = tmp_path / "iter_0000004"
    shutil.copytree(dp2_run / "checkpoints" / "iter_0000004", copy)
    rc, report = ckpt_json(capsys, "verify", copy)
    assert rc == 0 and [f["name"] for f in report["files"]] == ["__0_0.distcp", "__1_0.distcp"]
    with open(copy / "__1_0.distcp", "r+b") as f:
        f.seek(0)
        f.write(b"\0" * 64)  # the first item rank 1 wrote
    rc, out, err = ckpt(capsys, "verify", copy)
    assert rc == 1 and f"kaiyuan: error: {copy / '__1_0.distcp'}: " in err and "does not load" in err
    assert "__0_0.distcp" not in err


def test_diff_across_dp_sizes_reads_b_in_a_s_chunks(zero1_run, dp2_run, capsys):
    a, b = zero1_run / "checkpoints" / "iter_0000004", dp2_run / "checkpoints" / "iter_0000004"
    from kaiyuan_recipes.ckpt.store import read_dcp_metadata

    key = next(k for k in read_dcp_metadata(a).state_dict_metadata if k.endswith("exp_avg"))
    chunks = [len(read_dcp_metadata(p).state_dict_metadata[key].chunks) for p in (a, b)]
    assert chunks[0] != chunks[1]  # DP=2 splits a parameter range at the rank boundary
    rc, report = ckpt_json(capsys, "diff", a, b)
    ref_a, ref_b = full_state(a), full_state(b)
    for t in report["tensors"]:
        x, y = ref_a[t["key"]].float(), ref_b[t["key"]].float()
        assert t["max_abs"] == pytest.approx(float((x - y).abs().max()), rel=1e-6), t["key"]
