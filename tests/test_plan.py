"""One resolved plan per run: overrides reach the container by one route, rank 0 writes run_state/plan.json once
and the other ranks train with it, a launch host leaves `auto` to the training node, and status shows the plan."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from slurm_cluster import devnull_stdin  # noqa: F401 (fixture: the Slurm dry run's NeMo-Run reads stdin)

from kaiyuan_recipes.config.plan_file import plan_digest, read_plan, write_plan
from kaiyuan_recipes.config.run_layout import RunLayout

REPO = Path(__file__).resolve().parents[1]


def test_a_command_line_override_reaches_the_container_once(tmp_path, monkeypatch):
    from kaiyuan_recipes import compat
    from kaiyuan_recipes.training.config import build_config

    compat.import_megatron_bridge()  # its import-time workarounds first
    from megatron.bridge.training.utils import omegaconf_utils

    seen = []
    upstream = omegaconf_utils.process_config_with_overrides

    def counting(cfg, cli_overrides=None, **kw):
        seen.extend(cli_overrides or [])
        return upstream(cfg, cli_overrides=cli_overrides, **kw)

    monkeypatch.setattr(omegaconf_utils, "process_config_with_overrides", counting)
    cfg, run = build_config("gpt_smoke", ["kaiyuan.data=sample", f"kaiyuan.run_root={tmp_path}",
                                          "train.train_iters=7", "dataset.blend_per_split=null"])
    assert seen.count("train.train_iters=7") == 1
    assert cfg.train.train_iters == 7
    # the data source set dataset.blend_per_split=None itself; the user's value is kept, not applied again
    assert cfg.dataset.blend_per_split is None and cfg.dataset.blend is not None


RANK_SCRIPT = textwrap.dedent("""
    import hashlib, json, os, sys
    from kaiyuan_recipes.training import config
    if os.environ["RANK"] != "0":
        def built_again(*a, **k):
            raise AssertionError("a rank other than 0 built the config")
        config.build_config = built_again
    from kaiyuan_recipes.config.plan_file import plan_digest
    from kaiyuan_recipes.training.plan import plain_value, resolve_for_rank
    cfg, run, record = resolve_for_rank("gpt_smoke", sys.argv[2:])
    container = cfg.to_dict()
    container["dist"].pop("local_rank")
    with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json"), "w") as fh:
        json.dump({"digest": plan_digest(record), "layer_spec": run.layer_spec, "decided": run.decided,
                   "fast_path": {k: p.on for k, p in run.fastpath.pieces.items()},
                   "local_rank": cfg.dist.local_rank, "train_iters": cfg.train.train_iters,
                   "container": hashlib.sha256(json.dumps(container, default=plain_value).encode()).hexdigest(),
                   "hooks": len(getattr(cfg.model, "_pre_wrap_hooks", []))}, fh)
""")


def test_rank_0_builds_the_plan_once_and_the_other_rank_loads_it(tmp_path):
    """A 2-rank launch (gloo-free: torchrun's store carries the plan): rank 0 builds the config once, rank 1 loads
    the same container with no warning and installs the process-wide pieces itself (the chunked loss's hook)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    overrides = ["kaiyuan.data=mock", f"kaiyuan.run_root={tmp_path}", "kaiyuan.run_name=r", "train.train_iters=3",
                 "kaiyuan.chunked_loss=true"]
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
                          str(script), str(tmp_path), *overrides], capture_output=True, text=True, timeout=900,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "differs" not in out.stderr and "kaiyuan: rank" not in out.stderr, out.stderr[-4000:]
    plan = read_plan(tmp_path / "r")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["digest"] for r in ranks] == [plan_digest(plan)] * 2
    assert ranks[0]["decided"] == "this host" and ranks[1]["decided"] == "plan"
    assert [r["local_rank"] for r in ranks] == [0, 1]
    assert ranks[0]["container"] == ranks[1]["container"]
    assert ranks[0]["hooks"] == ranks[1]["hooks"] == 1, ranks  # chunked loss: a pre-wrap hook, in each process
    for rank in ranks:
        assert rank["layer_spec"] == plan["layer_spec"]["decided"]
        assert rank["fast_path"] == {k: p["on"] for k, p in plan["fast_path"].items()}
        assert rank["train_iters"] == plan["container"]["train"]["train_iters"] == 3
    assert plan["overrides"] == overrides and plan["world_size"] == 2
    state = RunLayout(tmp_path / "r")
    assert sorted(p.name for p in state.state.iterdir()) == ["plan.json", "run_config.yaml"]  # once, no leftovers


def test_a_rank_with_another_stack_is_refused_by_name(monkeypatch):
    from kaiyuan_recipes.training import plan

    record = {"stack": {**plan.stack_versions(), "megatron-core": "0.0.1"}}
    with pytest.raises(ValueError, match=r"rank 3 on .* has another stack than rank 0: megatron-core .* \(rank 0: "
                                         r"0\.0\.1\)"):
        plan.refuse_another_stack(record, 3)
    plan.refuse_another_stack({"stack": plan.stack_versions()}, 3)


def test_a_node_with_its_own_cache_trains_the_sample_corpus_from_it(tmp_path, monkeypatch):
    """Rank 0's plan names its cache's tokenizer and tokenized corpus; a node that shares no file system with it
    prepares its own and trains from there (the same files under another root), instead of failing in Megatron."""
    from kaiyuan_recipes.training import plan
    from kaiyuan_recipes.training.config import build_config, sample_corpus_on_this_node

    monkeypatch.setenv("KAIYUAN_CACHE", str(tmp_path / "node0"))
    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}"])
    text = plan.container_text(cfg, run.run_dir)
    monkeypatch.setenv("KAIYUAN_CACHE", str(tmp_path / "node1"))
    loaded, loaded_run = plan.load_container(text), plan.run_settings_from(plan.run_settings_record(run))
    assert str(tmp_path / "node0") in loaded.tokenizer.tokenizer_model
    sample_corpus_on_this_node(loaded, loaded_run)  # what resolve_for_rank does on a loading rank
    assert loaded.tokenizer.tokenizer_model.startswith(str(tmp_path / "node1"))
    prefixes, weights = loaded.dataset.blend
    assert all(p.startswith(str(tmp_path / "node1")) and Path(f"{p}.bin").is_file() for p in prefixes)
    assert list(weights) == list(cfg.dataset.blend[1])
    assert [Path(p).name for p in prefixes] == [Path(p).name for p in cfg.dataset.blend[0]]


@pytest.mark.parametrize("backend", [["--slurm", "batch", "--gpus-per-node", "8"],
                                     ["--hosts", "gpu1,gpu2", "--nproc-per-node", "8"]])
def test_a_launch_hosts_dry_run_leaves_the_layer_spec_to_the_training_node(tmp_path, monkeypatch, capsys, backend):
    from kaiyuan_recipes.cli.main import main
    from kaiyuan_recipes.training import config

    def decided_here(*a, **k):
        raise AssertionError("the launch host decided the layer spec")

    monkeypatch.setattr(config, "resolve_layer_spec", decided_here)
    monkeypatch.chdir(tmp_path)
    rc = main(["start", "gpt_smoke", "exp", *backend, "--dry-run", "kaiyuan.data=mock",
               "train.global_batch_size=128"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    assert "layer spec and fast path: decided on the training node" in out.err
    assert "kaiyuan_recipes.training.entry gpt_smoke" in out.out
    assert not (tmp_path / "runs" / "exp").exists()


def test_status_shows_the_runs_plan(tmp_path, capsys):
    from kaiyuan_recipes.cli.main import main

    run_dir = tmp_path / "r"
    RunLayout(run_dir).state.mkdir(parents=True)
    record = {"format": 1, "recipe": "gpt_smoke", "overrides": [], "world_size": 2,
              "decided": {"where": "this host", "host": "node7", "cuda": True, "transformer_engine": False},
              "layer_spec": {"knob": "auto", "decided": "fast", "why": "auto: no Transformer Engine, a CUDA host"},
              "fast_path": {"fast_spec": {"on": True, "reason": "SDPA"}, "cuda_graph": {"on": False, "reason": "x"}},
              "sdpa_backend": "auto", "knobs": {}, "container": {}}
    write_plan(run_dir, record)
    assert main(["status", "r", "--run-root", str(tmp_path)]) == 0
    shown = json.loads(capsys.readouterr().out)["plan"]
    assert shown == {"decided_on": "node7", "layer_spec": "fast", "fast_path_on": ["fast_spec"], "world_size": 2,
                     "digest": plan_digest(record)}

    from kaiyuan_recipes.ckpt.inspect import run_plan_of

    assert run_plan_of(RunLayout(run_dir).checkpoints / "iter_0000002")["digest"] == plan_digest(record)


# Records, per process, that it imported Megatron-Bridge (what building or checking a config costs): the audit hook
# of every Python process that inherits this sitecustomize.
IMPORT_WITNESS = textwrap.dedent('''
    import os, sys
    _seen = os.environ.get("KAIYUAN_TEST_BRIDGE_IMPORTS")
    if _seen:
        def _witness(event, args, done=[]):
            if event == "import" and args[0] == "megatron.bridge" and not done:
                done.append(1)
                with open(os.path.join(_seen, str(os.getpid())), "w") as fh:
                    fh.write(" ".join(sys.argv))
        sys.addaudithook(_witness)
''')


def _start(tmp_path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "start", "gpt_smoke", *args,
                           "kaiyuan.data=mock", f"kaiyuan.run_root={tmp_path / 'runs'}"],
                          capture_output=True, text=True, timeout=600, env=env)


def test_start_and_its_supervisor_launch_without_megatron_and_the_rank_builds_the_config_once(tmp_path):
    """`kaiyuan start` checks the launch without Megatron-Bridge; its supervisor runs the torchrun command without
    it too; the rank resolves the config once (and writes the plan)."""
    from test_lifecycle import wait_for

    from kaiyuan_recipes.launch.lifecycle import LocalRun

    hooks, seen = tmp_path / "hooks", tmp_path / "bridge_imports"
    hooks.mkdir()
    seen.mkdir()
    (hooks / "sitecustomize.py").write_text(IMPORT_WITNESS)
    env = {k: v for k, v in os.environ.items() if k != "KAIYUAN_SUPERVISED"}
    env.update(KAIYUAN_TEST_BRIDGE_IMPORTS=str(seen),
               PYTHONPATH=os.pathsep.join([str(hooks), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = _start(tmp_path, "once", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    run = LocalRun(tmp_path / "runs" / "once")
    try:  # rank 0 has built the config once it wrote the run's plan
        assert wait_for(lambda: run.layout.plan.is_file(), timeout=900), run.layout.console_log.read_text()[-3000:]
    finally:
        run.stop(grace=60)
    importers = sorted(p.read_text() for p in seen.iterdir())
    assert len(importers) == 1, importers  # not `start`, not the supervisor, nor anything up to torchrun
    assert "kaiyuan_recipes/training/entry.py gpt_smoke" in importers[0], importers
    assert "launching: " in run.layout.console_log.read_text()
    assert list(run.layout.logs.glob("train-*.log"))  # the launch's own log, as `kaiyuan train` writes it


def test_a_launch_megatron_bridge_rejects_ends_before_its_first_step_with_the_reason(tmp_path):
    """An override only Megatron-Bridge's own validation rejects: `start` returns at once (it checks only what it
    can without Megatron), and rank 0's resolution refuses the plan: the run fails before training, and `kaiyuan
    status` and the console say why in one line, without a traceback."""
    from test_lifecycle import wait_for

    from kaiyuan_recipes.launch.lifecycle import LocalRun

    out = _start(tmp_path, "bad", "scheduler.lr_warmup_fraction=0.5")
    assert out.returncode == 0, out.stderr[-3000:]
    run = LocalRun(tmp_path / "runs" / "bad")
    assert wait_for(lambda: run.status()["state"] != "running", timeout=900), run.status()
    status = run.status()
    assert status["state"] == "failed", status
    assert "the run's plan was refused: Megatron-Bridge rejected the configuration" in status["error"], status
    assert "lr_warmup_fraction" in status["error"]
    console = run.layout.console_log.read_text()
    assert "kaiyuan: training failed (exit 1): the run's plan was refused" in console, console[-3000:]
    assert "iteration" not in status


PLAN_OF_THIS_PROCESS = textwrap.dedent('''
    import json, sys
    from kaiyuan_recipes.config.plan_file import plan_digest, plan_text
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.plan import plan_record
    cfg, run = build_config("gpt_smoke", ["kaiyuan.data=mock", "kaiyuan.layer_spec=local"])
    record = plan_record(cfg, run, [], 2)
    print("@@" + json.dumps({"digest": plan_digest(record), "text": plan_text(record)}))
''')


def test_the_plan_is_the_same_text_in_every_process():
    """Two processes resolving the same launch write the same plan: functions and layer specs by import path, not
    by a repr holding a memory address (a rank after rank 0 then warned that its config differed, on every
    multi-rank launch)."""
    plans = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", PLAN_OF_THIS_PROCESS], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        plans.append(json.loads(next(line for line in done.stdout.splitlines() if line.startswith("@@"))[2:]))
    assert plans[0]["digest"] == plans[1]["digest"]
    assert " at 0x" not in plans[0]["text"]
    container = json.loads(plans[0]["text"])["container"]
    assert container["model"]["activation_func"] == "torch.nn.functional.silu"
    assert container["model"]["transformer_layer_spec"].endswith("local_layer_spec")
