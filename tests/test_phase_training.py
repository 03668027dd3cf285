"""Phase-to-phase training config: phase N resumes phase N-1's run directory with phase N's blend,
iterations count on, and the WSD schedule is identical in every phase (so the LR is continuous)."""

import pyarrow.parquet as pq
import pytest
import yaml

from kaiyuan_recipes.data.blend import BlendError
from kaiyuan_recipes.data.convert import ConvertOptions, convert_directory
from kaiyuan_recipes.data.phase_module import PhaseBlendDataModule
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
from kaiyuan_recipes.training.config import build_config
from kaiyuan_recipes.training.validate import resolve_with_upstream


@pytest.fixture(scope="module")
def curriculum(tmp_path_factory):
    """The sample corpus split into two 'phases': English, then Chinese."""
    from kaiyuan_recipes.data.sample_corpus import CORPUS_DIR

    root = tmp_path_factory.mktemp("cur")
    phases = {}
    for number, name in ((1, "en_jargon"), (2, "zh_poems")):
        src = root / f"in{number}"
        src.mkdir()
        pq.write_table(pq.read_table(CORPUS_DIR / f"{name}.parquet"), src / f"{name}.parquet")
        convert_directory(ConvertOptions(input_dir=src, output_dir=root / f"phase{number}",
                                         tokenizer_dir=default_tokenizer_dir(), output_prefix=f"phase{number}",
                                         num_shards=1), show_progress=False)
        phases[number] = {"tokens": 16 * 4096 * (60 if number == 1 else 40),
                          "sources": [{"name": f"phase{number}", "dir": str(root / f"phase{number}"),
                                       "weight": "tokens"}]}
    path = root / "two_phases.yaml"
    path.write_text(yaml.safe_dump({"seq_length": 4096, "global_batch_size": 16, "phases": phases}))
    return path


def test_phase_configs_continue_one_run(curriculum, tmp_path):
    common = [f"kaiyuan.run_root={tmp_path}", "kaiyuan.run_name=curr", "kaiyuan.data=curriculum",
              f"kaiyuan.curriculum={curriculum}", f"kaiyuan.tokenizer={default_tokenizer_dir()}"]
    cfg1, run1 = build_config("gpt_smoke", common + ["kaiyuan.phase=1"])
    cfg2, run2 = build_config("gpt_smoke", common + ["kaiyuan.phase=2"])
    assert (cfg1.train.train_iters, cfg2.train.train_iters) == (60, 100)
    assert cfg1.checkpoint.load == cfg2.checkpoint.load == cfg1.checkpoint.save  # phase 2 resumes phase 1
    for key in ("lr_decay_style", "lr_decay_iters", "lr_wsd_decay_iters", "lr_warmup_iters"):
        assert getattr(cfg1.scheduler, key) == getattr(cfg2.scheduler, key), key
    assert (cfg1.scheduler.lr_decay_iters, cfg1.scheduler.lr_wsd_decay_iters) == (100, 40)
    assert "phase1" in cfg1.dataset.blend[0][0] and "phase2" in cfg2.dataset.blend[0][0]
    # What Megatron checks when phase 2 loads phase 1's scheduler state: every total must match.
    resolved = [resolve_with_upstream(cfg, world_size=1).scheduler for cfg in (cfg1, cfg2)]
    for key in ("lr_decay_steps", "wd_incr_steps", "wsd_decay_steps", "lr_warmup_steps", "lr_decay_style",
                "start_weight_decay", "end_weight_decay", "weight_decay_incr_style"):
        assert getattr(resolved[0], key) == getattr(resolved[1], key), key
    assert resolved[1].lr_decay_steps == resolved[1].wd_incr_steps == 100 * 16


def test_phase_flag_and_errors(curriculum):
    with pytest.raises(ValueError, match="needs kaiyuan.curriculum"):
        build_config("gpt_smoke", ["kaiyuan.data=curriculum"])
    with pytest.raises(BlendError, match="unknown curriculum 'nope'; known: kaiyuan_2b"):
        PhaseBlendDataModule(curriculum="nope", phase=1).spec()
    module = PhaseBlendDataModule(curriculum=str(curriculum), phase=3, global_batch_size=16)
    with pytest.raises(BlendError, match="phase 3: not in the curriculum"):
        module.blend_fields()


def _plain_run_checkpointed_at_200(tmp_path):
    """A `kaiyuan train gpt_smoke` run (its own 200-step schedule) with a checkpoint record at iteration 200: its
    common overrides and the iteration folder."""
    common = [f"kaiyuan.run_root={tmp_path}", "kaiyuan.run_name=r", f"kaiyuan.tokenizer={default_tokenizer_dir()}"]
    plain, run = build_config("gpt_smoke", common)
    iteration = run.layout.checkpoints / "iter_0000200"
    iteration.mkdir(parents=True)
    # As training writes it: resolved (pretrain resolves the config in place before it saves). On megatron-bridge
    # 0.5.0 the record has no max_steps (not a field there); its resolved wd_incr_steps says what sized the schedule.
    resolve_with_upstream(plain, world_size=1).to_yaml(str(iteration / "run_config.yaml"))
    (run.layout.checkpoints / "latest_checkpointed_iteration.txt").write_text("200")
    return common, iteration


def test_a_phase_resuming_a_run_trained_on_another_schedule_adopts_the_curriculums(curriculum, tmp_path, capsys):
    """`kaiyuan train gpt_smoke` (its own 200-step schedule) then `--phase 2`: Megatron refuses a scheduler
    whose totals changed, so the phase launch overrides it with the curriculum's, and says so. A checkpoint of
    the same curriculum resumes as is."""
    common, iteration = _plain_run_checkpointed_at_200(tmp_path)
    phase = common + ["kaiyuan.data=curriculum", f"kaiyuan.curriculum={curriculum}"]
    cfg, _ = build_config("gpt_smoke", phase + ["kaiyuan.phase=2"])
    assert cfg.scheduler.override_opt_param_scheduler is True
    assert ("resumes a checkpoint trained on another schedule (max_steps 200 -> 100, lr_decay_iters 200 -> 100"
            in capsys.readouterr().err)
    phase1, _ = build_config("gpt_smoke", phase + ["kaiyuan.phase=1"])
    resolve_with_upstream(phase1, world_size=1).to_yaml(str(iteration / "run_config.yaml"))
    cfg, _ = build_config("gpt_smoke", phase + ["kaiyuan.phase=2"])
    assert not cfg.scheduler.override_opt_param_scheduler


def test_a_phase_leaves_an_explicit_override_opt_param_scheduler_false_to_the_user(curriculum, tmp_path):
    """The adoption is decided after the user's overrides: a `scheduler.override_opt_param_scheduler=false` given on
    the command line is not turned back on behind the user's back; a checkpoint on another schedule is refused at
    once, naming the override, instead of by Megatron after the model is built."""
    common, _ = _plain_run_checkpointed_at_200(tmp_path)
    phase = common + ["kaiyuan.data=curriculum", f"kaiyuan.curriculum={curriculum}", "kaiyuan.phase=2"]
    with pytest.raises(ValueError, match=r"scheduler.override_opt_param_scheduler=false"):
        build_config("gpt_smoke", phase + ["scheduler.override_opt_param_scheduler=false"])
    cfg, _ = build_config("gpt_smoke", phase + ["scheduler.override_opt_param_scheduler=true"])
    assert cfg.scheduler.override_opt_param_scheduler is True


def test_a_phase_counts_its_iterations_with_the_overridden_batch(curriculum, tmp_path):
    """train.global_batch_size on the command line is what the phase's token budget is divided by."""
    common = [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=curriculum", f"kaiyuan.curriculum={curriculum}",
              f"kaiyuan.tokenizer={default_tokenizer_dir()}"]
    cfg16, _ = build_config("gpt_smoke", common + ["kaiyuan.phase=1"])
    cfg8, _ = build_config("gpt_smoke", common + ["kaiyuan.phase=1", "train.global_batch_size=8"])
    assert cfg8.train.global_batch_size == 8
    assert cfg8.train.train_iters == 2 * cfg16.train.train_iters == 120
