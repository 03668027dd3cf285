"""The benchmark scripts' CPU-side parts: the plots of committed GPU results and the commands the 2-GPU
ZeRO benchmark runs."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("pattern", ["*_train.json", "*_stop_resume*.json", "*_train_throughput*.json",
                                     "*_onepass.json", "*_tp2_fast_spec.json", "*_serve_load*.json"])
def test_plot_results_draws_each_kind_of_result(tmp_path, pattern):
    files = sorted(str(p) for p in RESULTS.glob(pattern))
    assert files, pattern
    out = tmp_path / "plot.png"
    proc = run("benchmarks/plot_results.py", *files, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_pairs_needs_the_compared_iterations(tmp_path):
    """A pair report written before determinism_report.py recorded compared_at is refused by name, not drawn on
    a made-up iteration axis."""
    proc = run("benchmarks/plot_results.py", str(RESULTS / "2026-11-30_fast_vs_local_noise_floor.json"),
               "--out", str(tmp_path / "x.png"))
    assert proc.returncode != 0 and "has no compared_at" in proc.stderr and not (tmp_path / "x.png").exists()


def test_plot_results_refuses_mixed_kinds(tmp_path):
    files = [str(next(RESULTS.glob("*_train.json"))), str(next(RESULTS.glob("*_train_throughput*.json")))]
    proc = run("benchmarks/plot_results.py", *files, "--out", str(tmp_path / "x.png"))
    assert proc.returncode != 0 and "one kind" in proc.stderr


def test_zero_stages_compares_like_for_like():
    """Every configuration, the 1-GPU baseline included, runs the same step (the chunked loss, the whole-step
    graph and the fused weight-gradient accumulation do not apply under ZeRO 2), and each names its stage and
    GPU count."""
    proc = run("benchmarks/zero_stages.py", "--out", "unused.json", "--layer-spec", "fast", "--print-commands")
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert set(lines) == {"1gpu", "2gpu_zero0", "2gpu_zero1", "2gpu_zero2"}
    for name, command in lines.items():
        assert "kaiyuan.chunked_loss=false kaiyuan.cuda_graph=false kaiyuan.wgrad_fusion=false" in command
        assert "kaiyuan.layer_spec=fast" in command
        assert f"--nproc-per-node={1 if name == '1gpu' else 2}" in command
        assert f"kaiyuan.zero_stage={name[-1] if name != '1gpu' else 1}" in command
    proc = run("benchmarks/zero_stages.py", "--out", "unused.json", "--print-commands",
               "--variant", "zero2_nccl_ub", "2", "ddp.nccl_ub=true", "ddp.bucket_size=1000")
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["2gpu_zero2_nccl_ub"].endswith("kaiyuan.wgrad_fusion=false ddp.nccl_ub=true ddp.bucket_size=1000")
    assert "nccl_ub" not in lines["2gpu_zero2"]
    proc = run("benchmarks/zero_stages.py", "--out", "unused.json", "--print-commands", "--variant", "x", "3")
    assert proc.returncode == 2 and "--variant x: stage must be one of (0, 1, 2)" in proc.stderr
    proc = run("benchmarks/zero_stages.py", "--out", "unused.json", "--print-commands", "--only", "1gpu",
               "2gpu_zero2_nccl_ub", "--variant", "zero2_nccl_ub", "2", "ddp.nccl_ub=true")
    assert [line.split(" ", 1)[0] for line in proc.stdout.splitlines()] == ["1gpu", "2gpu_zero2_nccl_ub"]
    proc = run("benchmarks/zero_stages.py", "--out", "unused.json", "--print-commands", "--micro-batch", "4",
               "--micro-batches", "2", "--only", "2gpu_zero2")
    assert "train.micro_batch_size=4 train.global_batch_size=16 " in proc.stdout  # 4 x 2 per GPU, 2 GPUs
    proc = run("benchmarks/zero_stages.py", "--out", "unused.json", "--print-commands", "--only", "2gpu_zero3")
    assert proc.returncode == 2 and "--only: no row named 2gpu_zero3; the rows are 1gpu, 2gpu_zero0" in proc.stderr
    proc = run("benchmarks/zero_stages.py", "--out", "unused.json", "--print-commands", "--recipe-step",
               "--chunked-loss")
    assert proc.returncode == 0, proc.stderr
    assert "kaiyuan.cuda_graph" not in proc.stdout and "kaiyuan.chunked_loss" not in proc.stdout  # auto, defaults


def test_zero_stages_prints_the_commands_it_runs(tmp_path, monkeypatch):
    """--print-commands and the measured run build their commands in one place (row_plan): the commands the
    benchmark hands to the launcher are exactly the printed ones (but for the run root, a fresh temp dir)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput
    import zero_stages

    argv = ["--layer-spec", "fast", "--steps", "3", "--variant", "zero2_bf16_comm", "2",
            "ddp.megatron_fsdp_grad_comm_dtype=bf16", "--only", "1gpu", "2gpu_zero1", "2gpu_zero2_bf16_comm"]
    proc = run("benchmarks/zero_stages.py", "--out", "unused.json", *argv, "--print-commands")
    assert proc.returncode == 0, proc.stderr
    printed = [line.split(" ", 1)[1] for line in proc.stdout.splitlines()]
    launched = []

    def fake_run_bounded(command, timeout, env=None):
        root = next(a.split("=", 1)[1] for a in command if a.startswith("kaiyuan.run_root="))
        launched.append(shlex.join(a.replace(root, "RUN_ROOT") for a in command).replace(sys.executable, "PYTHON"))
        return 1, "no GPU here"

    monkeypatch.setattr(train_throughput, "run_bounded", fake_run_bounded)
    monkeypatch.setattr(train_throughput.tempfile, "mkdtemp", lambda *a, **k: str(tmp_path))  # each run's folder
    monkeypatch.setattr(zero_stages, "plot", lambda results, path: None)
    monkeypatch.setattr(sys, "argv", ["zero_stages.py", "--out", str(tmp_path / "z.json"), *argv])
    zero_stages.main()
    assert len(launched) == 3 and launched == [c.replace(sys.executable, "PYTHON") for c in printed]
    assert set(json.loads((tmp_path / "z.json").read_text())["results"]) == {"1gpu", "2gpu_zero1",
                                                                             "2gpu_zero2_bf16_comm"}


def test_committed_results_name_their_measuring_command():
    """No committed result file names a merge step as its command (merge_results.py keeps that under
    merged_by): the top level says what measured the figures."""
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        commands = data["command"] if isinstance(data["command"], list) else [data["command"]]
        assert commands and not any("merge_results.py" in c for c in commands), path.name


def test_zero_stages_baseline_must_be_the_same_run(tmp_path):
    """--baseline takes the 1gpu row of an earlier file only when it ran the same step at the same revision."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from provenance import revision
    from zero_stages import baseline_row

    settings = {"model": "qwen3_1p7b", "seq_length": 4096, "layer_spec": "fast", "micro_batch": 2,
                "micro_batches_per_gpu": 4, "chunked_loss": True, "recipe_step": False}
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"revision": revision(), **settings, "results": {"1gpu": {"tokens_per_s": 9.0}}}))
    assert baseline_row(earlier, {"revision": revision()} | settings) == {"tokens_per_s": 9.0,
                                                                           "from_file": "earlier.json"}
    with pytest.raises(SystemExit, match="recipe_step.*False, True"):
        baseline_row(earlier, {"revision": revision()} | settings | {"recipe_step": True})


def test_failed_megatron_row_names_the_ranks_exception(tmp_path, monkeypatch):
    """A failed run's row carries the exception a rank raised, not torchrun's report that a child failed, and
    the whole output is kept beside it; a run stopped after steady steps keeps their figures and says why."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    from kaiyuan_recipes.config.run_layout import METRICS_FILE

    rank_error = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1, in <module>\n"
                  "[rank0]: RuntimeError: CUDA graph capture failed: operation not permitted when stream is "
                  "capturing\n")
    torchrun = ("Traceback (most recent call last):\n  File \"run.py\", line 9, in main\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + "=" * 60 + "\n")
    outcome = {}
    monkeypatch.setattr(train_throughput, "run_bounded", lambda command, timeout, env=None: outcome["run"])
    monkeypatch.setattr(train_throughput.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    optional_import = ("Import of FP8GlobalStateManager failed with: Traceback (most recent call last):\n"
                       "AttributeError: module 'megatron.core.extensions.transformer_engine' has no attribute "
                       "'FP8GlobalStateManager'\n")  # logged and caught at start-up (no TE): not the failure
    outcome["run"] = (1, optional_import + "loading\n" + rank_error + torchrun)
    row = train_throughput.megatron_run("gpt_smoke", "fast", 1, 1, 128, 10)
    assert row["error"].endswith("[rank0]: RuntimeError: CUDA graph capture failed: operation not permitted when "
                                 "stream is capturing")
    assert "ChildFailedError" not in row["error"]
    assert Path(row["log"]).read_text() == outcome["run"][1]

    state = tmp_path / "gpt_smoke" / "run_state"
    state.mkdir(parents=True)
    settings = {"transformer_impl": "local", "fast_path": {"chunked_loss": True}}
    (state / METRICS_FILE).write_text(json.dumps({"event": "train_start", "iteration": 0, "model": settings}) + "\n"
                                      + "".join(
        json.dumps({"event": "step", "iteration": step, "tokens_per_s_per_gpu": 1000.0 * step,
                    "model_tflops_per_gpu": 1.0, "peak_mem_gb": 2.0, "loss": 12.0 - step}) + "\n"
        for step in range(1, 8)))
    outcome["run"] = (None, "step 7\ntimed out after 60 s")
    row = train_throughput.megatron_run("gpt_smoke", "fast", 1, 1, 128, 10)
    assert row["tokens_per_s"] == 5500.0 and row["incomplete"] == "timed out after 60 s; 7 of 10 steps done"
    assert row["losses"] == [11.0, 10.0, 9.0, 8.0, 7.0, 6.0, 5.0]
    assert row["model_settings"] == settings  # what the run recorded it trained with


def test_a_row_without_te_hides_te_from_its_process_or_refuses(tmp_path, monkeypatch):
    """ours_without_te runs `ours` with the PYTHONPATH folders that hold transformer_engine left out (the GPU host's
    /tmp/site-te); where TE would still import (site-packages), the row is refused, not run with TE."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    te_site, other = tmp_path / "site-te", tmp_path / "site"
    (te_site / "transformer_engine").mkdir(parents=True)
    (te_site / "transformer_engine" / "__init__.py").write_text("")
    other.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(other), str(te_site)]))
    check = [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('transformer_engine') is None)"]
    assert subprocess.run(check, capture_output=True, text=True).stdout.strip() == "False"  # importable here
    env = train_throughput.without_te_env()
    assert env["PYTHONPATH"] == str(other)
    assert subprocess.run(check, env=env, capture_output=True, text=True).stdout.strip() == "True"

    import zipfile  # TE importable from an entry that is not a folder holding it: not hidden, so refused

    with zipfile.ZipFile(tmp_path / "te.zip", "w") as zf:
        zf.writestr("transformer_engine/__init__.py", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(other), str(tmp_path / "te.zip")]))
    with pytest.raises(RuntimeError, match="cannot be hidden"):
        train_throughput.without_te_env()
    assert train_throughput.WITHOUT_TE["ours_without_te"] in train_throughput.MEGATRON_IMPLS


def test_train_throughput_bounds_each_implementation(tmp_path):
    """--impl-timeout: an implementation past its time records the timeout (its process group is gone) and
    the file is still written; within it, the child's figures come back (CPU smoke of the HF loop)."""
    import json

    out = tmp_path / "tt.json"
    common = ["benchmarks/train_throughput.py", "--models", "gpt_smoke", "--impls", "hf_eager", "--device", "cpu",
              "--tiny", "--steps", "4", "--out", str(out)]
    proc = run(*common, "--impl-timeout", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["results"]["gpt_smoke"]["hf_eager"] == {"error": "timed out after 0.5 s"}
    proc = run(*common, "--impl-timeout", "240")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())["results"]["gpt_smoke"]["hf_eager"]
    assert row["tokens_per_s"] > 0 and row["loss"] > 0


def test_every_throughput_variant_is_a_config_upstream_accepts(tmp_path):
    """Each Megatron row of benchmarks/train_throughput.py (the fast spec's A/B variants included) is a valid
    `kaiyuan train` command whose config Megatron-Bridge accepts: a bad override costs no GPU call."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from train_throughput import BATCH, MEGATRON_IMPLS, megatron_command

    from kaiyuan_recipes import compat
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import resolve_with_upstream

    mbs, micro = BATCH["qwen3_1p7b"]
    for impl, (spec, extra) in MEGATRON_IMPLS.items():
        command = megatron_command("qwen3_1p7b", spec, mbs, micro, 4096, 10, tmp_path, 1, extra)
        assert command[3:6] == ["train", "qwen3_1p7b", "--nproc-per-node=1"], impl
        if spec == "transformer_engine" and not compat.transformer_engine_available():
            # No TE here: the row is refused by name, and its overrides must still be known fields with valid
            # values (checked on the local spec; TE's own validation runs on the GPU host).
            with pytest.raises(RuntimeError, match="transformer_engine is not installed"):
                build_config("qwen3_1p7b", command[6:])
            local = [a.replace("layer_spec=transformer_engine", "layer_spec=local") for a in command[6:]]
            cfg, _ = build_config("qwen3_1p7b", local)
            for override in extra:
                key, value = override.split("=", 1)
                if key.startswith("model."):
                    assert str(getattr(cfg.model, key[6:])).lower() == value, (impl, override)
            continue
        cfg, run = build_config("qwen3_1p7b", command[6:])
        assert run.layer_spec == spec and cfg.train.global_batch_size == mbs * micro, impl
        assert cfg.validation.eval_iters == 0, impl  # timed steps only: no evaluation compiles after them
        resolve_with_upstream(cfg, world_size=1)


# The TE rows' loss: the peers (Megatron-LM's, Bridge's settings) keep whole logits whatever the recipe's auto does
TE_ROWS_CHUNKED = {"recipe_te": True, "megatron_te": False, "bridge_te": False, "megatron_te_graph": False,
                   "megatron_te_chunked_loss": True}


def test_the_te_peers_keep_whole_logits_and_the_recipe_row_trains_what_auto_does(tmp_path):
    """The chunked-loss decision each TE row's overrides give on TE's spec (fastpath/decisions.py, asked with the
    layer spec set to TE: TE does not import here)."""
    import dataclasses

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from train_throughput import MEGATRON_IMPLS

    from kaiyuan_recipes.fastpath.decisions import _chunked_loss
    from kaiyuan_recipes.training.config import build_config

    te_rows = {impl: extra for impl, (spec, extra) in MEGATRON_IMPLS.items() if spec == "transformer_engine"}
    assert set(te_rows) == set(TE_ROWS_CHUNKED)
    for impl, extra in te_rows.items():
        knobs = [o for o in extra if o.startswith("kaiyuan.")]
        cfg, run = build_config("qwen3_1p7b", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock",
                                               "kaiyuan.layer_spec=fast", *knobs])
        piece = _chunked_loss(cfg, dataclasses.replace(run, layer_spec="transformer_engine"))
        assert piece.on is TE_ROWS_CHUNKED[impl], (impl, piece.reason)


def test_row_settings_are_what_each_rows_overrides_change(tmp_path, monkeypatch):
    """benchmarks/row_settings.py builds each row's config as train_throughput's command states it: `ours` and
    `ours_eager` differ in the whole-step graph (and the weight-gradient fusion auto ties to it) and nothing else;
    a row that only restates a default is named the same as `ours`, and one that turns off a fast-path piece
    (outside the model config) is not."""
    out = tmp_path / "settings.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/row_settings.py"), "--models", "gpt_smoke", "--impls",
                    "ours", "ours_eager", "--out", str(out)], check=True, capture_output=True, cwd=tmp_path)
    result = json.loads(out.read_text())["gpt_smoke"]
    ours, eager = result["settings"]["ours"], result["settings"]["ours_eager"]
    assert {k for k in ours if ours[k] != eager[k]} == {"cuda_graph_impl", "gradient_accumulation_fusion",
                                                         "fast_path"}
    assert {k for k in ours["fast_path"] if ours["fast_path"][k] != eager["fast_path"][k]} == {"cuda_graph",
                                                                                               "wgrad_fusion"}
    assert ours["cuda_graph_impl"] == "full_iteration" and eager["cuda_graph_impl"] == "none"
    assert result["same_settings"] == []

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import row_settings
    import train_throughput

    # row_settings reads train_throughput's table itself (the same dict)
    monkeypatch.setitem(train_throughput.MEGATRON_IMPLS, "ours_restated", ("fast", ("kaiyuan.chunked_loss=true",)))
    monkeypatch.setattr(sys, "argv", ["row_settings.py", "--models", "gpt_smoke", "--impls", "ours",
                                      "ours_restated", "ours_full_logits", "--out", str(out)])
    row_settings.main()
    assert json.loads(out.read_text())["gpt_smoke"]["same_settings"] == [["ours", "ours_restated"]]
    assert row_settings.row_overrides("gpt_smoke", "ours_eager") == train_throughput.megatron_command(
        "gpt_smoke", "fast", 4, 4, 4096, 15, Path("/tmp/row-settings"), extra=("kaiyuan.cuda_graph=false",))[6:]


def test_merge_results_joins_models_measured_in_separate_runs(tmp_path, monkeypatch):
    """Two real train_throughput runs (CPU smoke, one model each) merge into the issue's one-file shape; the
    same model twice, or two revisions, are refused by name."""
    monkeypatch.setenv("KAIYUAN_REVISION", "abc1234")
    common = ["benchmarks/train_throughput.py", "--impls", "hf_eager", "--device", "cpu", "--tiny", "--steps", "2"]
    for model in ("gpt_smoke", "qwen3_1p7b"):
        proc = run(*common, "--models", model, "--out", str(tmp_path / f"{model}.json"))
        assert proc.returncode == 0, proc.stderr
    out = tmp_path / "merged.json"
    proc = run("benchmarks/merge_results.py", str(tmp_path / "gpt_smoke.json"), str(tmp_path / "qwen3_1p7b.json"),
               "--out", str(out), "--note", "two GPUs at once")
    assert proc.returncode == 0, proc.stderr
    merged = json.loads(out.read_text())
    assert merged["revision"] == "abc1234" and merged["seq_length"] == 4096 and merged["note"] == "two GPUs at once"
    assert set(merged["results"]) == {"gpt_smoke", "qwen3_1p7b"} and set(merged["batch"]) == set(merged["results"])
    assert merged["results"]["qwen3_1p7b"]["hf_eager"]["tokens_per_s"] > 0
    assert [r["models"] for r in merged["runs"]] == [["gpt_smoke"], ["qwen3_1p7b"]]
    # the top level names the measuring commands (the parts'), the merge step its own under merged_by
    parts = [json.loads((tmp_path / f"{m}.json").read_text())["command"] for m in ("gpt_smoke", "qwen3_1p7b")]
    assert merged["command"] == parts and all("train_throughput.py" in c for c in parts)
    assert merged["merged_by"].startswith("python benchmarks/merge_results.py ")

    proc = run("benchmarks/merge_results.py", str(tmp_path / "gpt_smoke.json"), str(tmp_path / "gpt_smoke.json"),
               "--out", str(tmp_path / "x.json"))
    assert proc.returncode != 0 and "gpt_smoke is also measured in another file" in proc.stderr
    # --replace: a row measured again in a later call replaces the earlier one; the file names each row's source
    first, again = json.loads((tmp_path / "gpt_smoke.json").read_text()), tmp_path / "again.json"
    first["results"]["gpt_smoke"] = {"ours": {"tokens_per_s": 300.0}, "hf_compile": {"tokens_per_s": 100.0},
                                     "hf_eager": {"error": "timed out after 80.0 s"}}
    (tmp_path / "first.json").write_text(json.dumps(first))
    again.write_text(json.dumps(first | {"results": {"gpt_smoke": {"hf_eager": {"tokens_per_s": 150.0},
                                                                   "ours": {"tokens_per_s": 200.0}}}}))
    proc = run("benchmarks/merge_results.py", str(tmp_path / "first.json"), str(again), "--replace",
               "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["results"]["gpt_smoke"]
    assert rows["hf_eager"] == {"tokens_per_s": 150.0}
    assert rows["row_files"] == {"ours": "again.json", "hf_compile": "first.json", "hf_eager": "again.json"}
    # a ratio is measured in one run: ours (again.json) over hf_compile (first.json) is refused, with the reason
    assert "ours_vs_hf_compile" not in rows
    assert rows["ratios_not_computed"] == {
        "ours_vs_hf_compile": "ours and hf_compile were measured in different runs (again.json, first.json)"}
    # rows of one run give their ratio; an unfinished row does not
    again.write_text(json.dumps(first | {"results": {"gpt_smoke": {"hf_compile": {"tokens_per_s": 50.0},
                                                                   "ours": {"tokens_per_s": 200.0}}}}))
    assert run("benchmarks/merge_results.py", str(tmp_path / "first.json"), str(again), "--replace",
               "--out", str(out)).returncode == 0
    assert json.loads(out.read_text())["results"]["gpt_smoke"]["ours_vs_hf_compile"] == 4.0
    again.write_text(json.dumps(first | {"results": {"gpt_smoke": {
        "hf_compile": {"tokens_per_s": 50.0, "incomplete": "timed out; 5 of 12 steps done"},
        "ours": {"tokens_per_s": 200.0}}}}))
    assert run("benchmarks/merge_results.py", str(tmp_path / "first.json"), str(again), "--replace",
               "--out", str(out)).returncode == 0
    rows = json.loads(out.read_text())["results"]["gpt_smoke"]
    assert "ours_vs_hf_compile" not in rows and "did not finish" in rows["ratios_not_computed"]["ours_vs_hf_compile"]
    other = json.loads((tmp_path / "qwen3_1p7b.json").read_text()) | {"revision": "def5678"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    proc = run("benchmarks/merge_results.py", str(tmp_path / "gpt_smoke.json"), str(tmp_path / "other.json"),
               "--out", str(tmp_path / "x.json"))
    assert proc.returncode != 0 and "revision differs" in proc.stderr and not (tmp_path / "x.json").exists()


def test_zero_stages_scaling_efficiency_only_between_finished_rows_of_as_many_timed_steps():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from zero_stages import efficiency

    base = {"tokens_per_s": 100.0, "timed_steps": 9}
    row = {"tokens_per_s": 95.0, "timed_steps": 9}
    efficiency(row, base)
    assert row["scaling_efficiency"] == 0.95
    short = {"tokens_per_s": 100.0, "timed_steps": 1, "incomplete": "timed out; 4 of 10 steps done"}
    for baseline, reason in ((short, "the 1gpu row did not finish"), ({"tokens_per_s": 100.0, "timed_steps": 5},
                                                                       "timed steps differ: 9 here, 5 on 1 GPU")):
        row = {"tokens_per_s": 95.0, "timed_steps": 9}
        efficiency(row, baseline)
        assert "scaling_efficiency" not in row and reason in row["scaling_efficiency_not_computed"]


def test_a_result_records_its_command_as_a_shell_would_take_it_back(monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from provenance import this_command

    argv = ["benchmarks/serve_load.py", "--baseline-args", "--max-batch 64 --max-seq-len 4096", "--out", "o.json"]
    monkeypatch.setattr(sys, "argv", argv)
    assert shlex.split(this_command()) == ["python", *argv]  # the quoted option stays one argument


def test_a_result_from_a_changed_tree_names_the_commit_it_becomes(tmp_path, monkeypatch):
    """The GPU host's copy of the tree carries a .git at the last landed commit: a result measured there on newer
    code must not name that commit, and must name the tree that ran, which resolves to its commit once made."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from provenance import resolve_tree, revision

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / ".gitignore").write_text("out/\n")
    (tmp_path / "f.py").write_text("a = 1\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "landed"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KAIYUAN_REVISION", raising=False)
    assert revision() == head
    (tmp_path / "f.py").write_text("a = 2\n")
    (tmp_path / "new.py").write_text("b = 1\n")  # a file committed after the landing: untracked on the GPU host
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "result.json").write_text("{}")  # ignored: not part of the tree
    objects = len(list((tmp_path / ".git" / "objects").rglob("*")))
    measured = revision()
    assert measured.startswith(f"{head}+tree ")
    assert len(list((tmp_path / ".git" / "objects").rglob("*"))) == objects  # the repository is left as it was
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout.count("??") == 1
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "the measured code"], check=True)
    later = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert resolve_tree(measured.split("+tree ")[1]) == later
    (tmp_path / "f.py").write_text("a = 1\n")
    (tmp_path / "f.py").write_text("a = 2\n")  # touched, same content as the commit: no +tree
    assert revision() == later
    monkeypatch.setenv("KAIYUAN_REVISION", "abc1234")
    assert revision() == "abc1234"
    with pytest.raises(ValueError, match="7 or more"):
        resolve_tree("")
