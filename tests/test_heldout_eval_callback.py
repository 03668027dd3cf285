"""kaiyuan.heldout_eval in the training loop: the knob checked when the config is built (a bad file refused before
training, naming its lines), and the Megatron-Bridge callback driven with gpt_smoke's built ConfigContainer,
Bridge's own GlobalState (its TensorBoard writer, its signal handler) and a real megatron-core model on the CPU:
evaluations at the interval, figures in TensorBoard, metrics.jsonl, the per-sample file and `kaiyuan status`,
train mode restored, and a stop requested during an evaluation honoured."""

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import megatron_forward_on_cpu, tiny_gpt_shape

from kaiyuan_recipes.data.heldout_scoring import OVERALL
from kaiyuan_recipes.training.heldout_eval.check import HeldoutEvalConfigError

SEQ = 48
SMALL = [f"dataset.seq_length={SEQ}", "train.global_batch_size=4", "train.micro_batch_size=2",
         "kaiyuan.layer_spec=local"]
ROWS = [
    {"dimension": "math", "prompt": "Question: 2 + 3 = ?\nAnswer:", "completion": " 5",
     "choices": [" 4", " 5", " 6", " 7"], "answer": 1},
    {"dimension": "math", "prompt": "1 + 1 =", "completion": " 2"},
    {"dimension": "code", "prompt": "import", "completion": " numpy as np"},
    {"dimension": "code", "prompt": " ".join(["x"] * 80), "completion": " = 1"},  # longer than SEQ: cut, counted
]


@pytest.fixture()
def heldout_file(tmp_path):
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def config(tmp_path, *overrides):
    """The config as a launcher has it: built, then checked (validate() checks kaiyuan.heldout_eval too)."""
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import validate

    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path / 'runs'}", *SMALL, *overrides])
    validate(cfg, run, 1, upstream=False)
    return cfg, run


def test_a_malformed_file_is_refused_when_the_config_is_built_naming_its_lines(tmp_path, capsys):
    from kaiyuan_recipes.cli.main import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{oops\n" + json.dumps({"dimension": "math", "prompt": "p"}) + "\n"
                   + json.dumps(ROWS[1] | {"choices": [" a", " b"], "answer": 5}) + "\n")
    with pytest.raises(HeldoutEvalConfigError) as err:
        config(tmp_path, f"kaiyuan.heldout_eval={bad}")
    message = str(err.value)
    assert message.startswith(f"kaiyuan.heldout_eval: {bad}: 3 problem(s): ")
    assert "line 2: not JSON" in message and "line 3: 'completion' missing or empty" in message
    assert "line 4: 'answer' must be an integer index of the choices (0..1), got 5" in message
    # the launcher says it in one line before starting anything
    assert main(["train", "gpt_smoke", "--dry-run", f"kaiyuan.run_root={tmp_path / 'runs'}",
                 f"kaiyuan.heldout_eval={bad}"]) == 2
    assert "line 2: not JSON" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(HeldoutEvalConfigError, match="missing.jsonl: no such file"):
        config(tmp_path, f"kaiyuan.heldout_eval={tmp_path / 'missing.jsonl'}")


def test_layouts_the_scorer_cannot_run_are_refused_up_front(tmp_path, heldout_file):
    from kaiyuan_recipes.config.knobs import KnobError

    with pytest.raises(HeldoutEvalConfigError, match="pipeline_model_parallel_size=2 is not supported"):
        config(tmp_path, f"kaiyuan.heldout_eval={heldout_file}", "model.pipeline_model_parallel_size=2")
    with pytest.raises(HeldoutEvalConfigError, match="tokenizer_type=NullTokenizer"):
        config(tmp_path, f"kaiyuan.heldout_eval={heldout_file}", "kaiyuan.data=mock")
    with pytest.raises(KnobError, match="heldout_eval_interval: expected a positive number"):
        config(tmp_path, f"kaiyuan.heldout_eval={heldout_file}", "kaiyuan.heldout_eval_interval=0")
    cfg, run = config(tmp_path, f"kaiyuan.heldout_eval={heldout_file}")
    from kaiyuan_recipes.training.heldout_eval.check import eval_interval

    assert eval_interval(cfg, run) == cfg.validation.eval_interval == 100  # the default: validation's interval


@pytest.fixture()
def trained(megatron_parallel, tmp_path, heldout_file, monkeypatch):
    """What the callback sees in a worker: the built config, Bridge's GlobalState, the model in train mode."""
    from megatron.bridge.training.state import GlobalState

    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
    from kaiyuan_recipes.training.entry import worker_callbacks

    megatron_forward_on_cpu(monkeypatch.setattr)
    # the parameter all-gather overlap toggles hooks of megatron-core's DDP wrapper, which needs CUDA streams
    cfg, run = config(tmp_path, f"kaiyuan.heldout_eval={heldout_file}", "kaiyuan.heldout_eval_interval=2",
                      "ddp.overlap_param_gather=false", "optimizer.overlap_param_gather=false")
    callbacks = worker_callbacks(cfg, run)
    torch.manual_seed(0)
    model = build_cpu_model(tiny_gpt_shape(seq_length=SEQ, max_position_embeddings=SEQ, vocab_size=151936))
    state = GlobalState()
    state.cfg = cfg
    return cfg, run, callbacks, state, model.train()


def context(state, model, step):
    from megatron.bridge.training.callbacks import CallbackContext

    state.train_state.step = step
    return CallbackContext(state=state, model=[model], optimizer=None)


def test_evaluations_at_the_interval_reach_tensorboard_metrics_and_status(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kaiyuan_recipes.config.run_layout import read_metrics
    from kaiyuan_recipes.launch.lifecycle import LocalRun
    from kaiyuan_recipes.training.heldout_eval.callback import HeldoutEvalCallback
    from kaiyuan_recipes.training.metrics import RunMetricsCallback

    cfg, run, callbacks, state, model = trained
    (metrics_cb,) = [c for c in callbacks if isinstance(c, RunMetricsCallback)]
    (heldout,) = [c for c in callbacks if isinstance(c, HeldoutEvalCallback)]
    assert callbacks.index(heldout) > callbacks.index(metrics_cb)  # after the step's own line
    for step in range(4):  # iterations 1..4
        metrics_cb._last_end = 1.0
        heldout.on_train_step_end(context(state, model, step))
        assert model.training and torch.is_grad_enabled()
        assert (metrics_cb._last_end is None) == ((step + 1) % 2 == 0)  # the next step's clock restarts
    evals = [r for r in read_metrics(run.layout.state) if r["event"] == "heldout_eval"]
    assert [r["iteration"] for r in evals] == [2, 4]
    overall = evals[-1]["overall"]
    assert overall["samples"] == 4 and overall["mcq_samples"] == 1 and overall["truncated"] == 1
    assert set(evals[-1]["dimensions"]) == {"math", "code"} and evals[-1]["sequences"] == 4 + 4
    assert evals[0]["overall"] == overall  # the weights did not change between them

    per_sample = json.loads((run.layout.heldout_eval / "iter_0000004.json").read_text())
    assert [r["line"] for r in per_sample["samples"]["in_training"]] == [1, 2, 3, 4]
    assert per_sample["results"]["in_training"][OVERALL] == overall

    state.tensorboard_logger.flush()
    events = EventAccumulator(str(run.layout.tensorboard))
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in ("heldout/overall/nll_per_token", "heldout/math/mcq_acc_avg_norm", "heldout/code/bits_per_byte",
                "heldout/overall/mcq_acc_sum", "heldout/eval_time_s"):
        assert tag in tags, tags
    assert "heldout/code/mcq_acc_avg_norm" not in tags  # no choices in that dimension
    nll = events.Scalars("heldout/overall/nll_per_token")
    assert [e.step for e in nll] == [2, 4] and nll[-1].value == pytest.approx(overall["nll_per_token"])

    status = LocalRun(run.run_dir).status()
    assert status["heldout_eval"]["iteration"] == 4
    assert status["heldout_eval"]["mcq_acc_avg_norm"] == overall["mcq_acc_avg_norm"]
    assert status["heldout_eval"]["bits_per_byte"] == overall["bits_per_byte"]


def test_a_stop_requested_during_an_evaluation_ends_it_unreported(trained):
    """`kaiyuan stop` sends SIGTERM; Bridge's signal handler (the one its train loop asks) records it, and the
    evaluation asks the same handler between batches, so it ends and Bridge's loop goes on to save and exit."""
    from megatron.bridge.training.utils.sig_utils import DistributedSignalHandler

    from kaiyuan_recipes.config.run_layout import read_metrics
    from kaiyuan_recipes.training.heldout_eval.callback import HeldoutEvalCallback

    cfg, run, callbacks, state, model = trained
    assert cfg.train.exit_signal_handler
    (heldout,) = [c for c in callbacks if isinstance(c, HeldoutEvalCallback)]
    with DistributedSignalHandler(signal.SIGTERM) as handler:
        state._signal_handler = handler
        os.kill(os.getpid(), signal.SIGTERM)
        assert heldout.evaluate(context(state, model, 1), 2) is None
    assert model.training
    assert not [r for r in read_metrics(run.layout.state) if r["event"] == "heldout_eval"]
    assert not run.layout.heldout_eval.exists()


def test_evaluations_reach_the_wandb_and_mlflow_runs_bridge_configured(megatron_parallel, tmp_path, heldout_file,
                                                                      monkeypatch):
    """A user who set Megatron-Bridge's W&B / MLflow logger options sees the held-out figures in those runs, logged
    through the loggers Bridge's GlobalState opened (W&B offline, MLflow in a local file store)."""
    import mlflow
    import wandb
    from megatron.bridge.training.state import GlobalState

    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
    from kaiyuan_recipes.training.entry import worker_callbacks
    from kaiyuan_recipes.training.heldout_eval.callback import HeldoutEvalCallback

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny has no database store
    megatron_forward_on_cpu(monkeypatch.setattr)
    store = (tmp_path / "mlruns").as_uri()
    cfg, run = config(tmp_path, f"kaiyuan.heldout_eval={heldout_file}", "kaiyuan.heldout_eval_interval=1",
                      "ddp.overlap_param_gather=false", "optimizer.overlap_param_gather=false",
                      "logger.wandb_project=kaiyuan-test", "logger.wandb_exp_name=heldout",
                      f"logger.wandb_save_dir={tmp_path / 'wandb'}", "logger.mlflow_experiment=kaiyuan-test",
                      "logger.mlflow_run_name=heldout", f"logger.mlflow_tracking_uri={store}")
    (heldout,) = [c for c in worker_callbacks(cfg, run) if isinstance(c, HeldoutEvalCallback)]
    torch.manual_seed(0)
    model = build_cpu_model(tiny_gpt_shape(seq_length=SEQ, max_position_embeddings=SEQ, vocab_size=151936)).train()
    state = GlobalState()
    state.cfg = cfg
    try:
        for step in range(2):  # iterations 1 and 2
            heldout.on_train_step_end(context(state, model, step))
        run_id = mlflow.active_run().info.run_id
        wandb_dir = wandb.run.dir
    finally:
        wandb.finish()
        mlflow.end_run()
    overall = [r for r in read_metrics_of(run) if r["event"] == "heldout_eval"][-1]["overall"]

    history = mlflow.MlflowClient(store).get_metric_history(run_id, "heldout/overall_nll_per_token")
    assert [m.step for m in history] == [1, 2] and history[-1].value == pytest.approx(overall["nll_per_token"])
    math_acc = mlflow.MlflowClient(store).get_metric_history(run_id, "heldout/math_mcq_acc_avg_norm")
    assert [m.step for m in math_acc] == [1, 2]

    history = wandb_history(Path(wandb_dir).parent)
    assert [h["_step"] for h in history] == [1, 2]
    assert history[-1]["heldout/overall/nll_per_token"] == pytest.approx(overall["nll_per_token"])
    assert history[-1]["heldout/math/mcq_acc_avg_norm"] == overall_of(run, "math")["mcq_acc_avg_norm"]


def wandb_history(run_dir):
    """The history rows of an offline W&B run, read from its .wandb file with wandb's own record reader."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (log,) = run_dir.glob("*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(log))
    rows = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def overall_of(run, dimension):
    return [r for r in read_metrics_of(run) if r["event"] == "heldout_eval"][-1]["dimensions"][dimension]


def read_metrics_of(run):
    from kaiyuan_recipes.config.run_layout import read_metrics

    return read_metrics(run.layout.state)
