"""`kaiyuan average`: on real training checkpoints (ZeRO-1, optimizer state, written by Megatron-Bridge's saver), the
average of checkpoints A and B equals (A+B)/2 tensor by tensor (read back through torch.distributed.checkpoint, not
through the code under test), weights are honoured, the result exports to HF, and kaiyuan.average_last keeps the
checkpoints averaging needs from keep-last-K."""

import json
import subprocess
import sys

import pytest
import torch
from test_ckpt import NO_OVERLAP, write_run

from kaiyuan_recipes.ckpt.regions import Region, load_region, tensor_entries
from kaiyuan_recipes.ckpt.store import read_dcp_metadata
from kaiyuan_recipes.cli.main import main
from kaiyuan_recipes.config.run_layout import iteration_dirs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Saves at 2, 4 and 6 with keep-last-2, and kaiyuan.average_last=3 keeping all three."""
    return write_run(tmp_path_factory.mktemp("avg"), "train", "avg", [2, 4, 6], "train.train_iters=6",
                     "checkpoint.save_interval=2", "checkpoint.most_recent_k=2", "kaiyuan.average_last=3",
                     *NO_OVERLAP)


def weights_of(ckpt):
    """Every model tensor of a checkpoint in fp32, by key (optimizer entries left out)."""
    metadata = read_dcp_metadata(ckpt)
    return {key: load_region(ckpt, Region(key, (0,) * len(md.size), tuple(md.size)), md.properties.dtype, metadata)
            for key, md in tensor_entries(metadata).items() if not key.startswith("optimizer.")}


def average(capsys, *args):
    """A refused request, in this process (it fails before any model or process group exists)."""
    rc = main(["average", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    return rc, out, err


def average_run(*args):
    """`kaiyuan average` as a user runs it: its own process (it sets up a process group to rebuild the models)."""
    proc = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "average", *map(str, args), "--json"],
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def test_average_last_keeps_what_averaging_needs(run):
    assert [p.name for p in iteration_dirs(run / "checkpoints")] == ["iter_0000002", "iter_0000004", "iter_0000006"]


def small_tokenizer(path):
    """A byte-level BPE of a few hundred tokens, ending texts with <|endoftext|>: it fits this test model's
    1,024-row vocabulary, which the bundled tokenizer (151,646 tokens) does not."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer.train_from_iterator(["the mean of two checkpoints"] * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.mkdir()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                            "tokenizer_class": "PreTrainedTokenizerFast"}))
    return path


def test_the_mean_of_two_checkpoints_is_their_tensor_by_tensor_mean_and_exports(run, tmp_path):
    rc, out, err = average_run(run, tmp_path / "avg", "--last", "2")
    assert rc == 0, err
    report = json.loads(out)
    assert [p.rsplit("/", 1)[1] for p in report["sources"]] == ["iter_0000004", "iter_0000006"]
    assert report["weights"] == [0.5, 0.5] and "dropped" in report["optimizer_state"]
    a, b = (weights_of(p) for p in iteration_dirs(run / "checkpoints")[1:])
    written = iteration_dirs(tmp_path / "avg")[0]
    mean = weights_of(written)
    assert set(mean) == set(a) and len(mean) == report["tensors"] > 5
    changed = 0
    for key, value in mean.items():
        expected = ((a[key].float() + b[key].float()) / 2).to(value.dtype)
        assert torch.equal(value, expected), key
        changed += not torch.equal(a[key], b[key])
    assert changed > 5  # training moved the weights between A and B: the mean is not one of them
    assert json.loads((written / "averaged_from.json").read_text())["iterations"] == [4, 6]
    assert (written / "run_config.yaml").read_text() == (iteration_dirs(run / "checkpoints")[-1] /
                                                          "run_config.yaml").read_text()
    hf = tmp_path / "avg_hf"
    proc = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "export", "hf", str(tmp_path / "avg"),
                           str(hf), "--tokenizer", str(small_tokenizer(tmp_path / "tok"))],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    embedding = next(v for k, v in mean.items() if k.endswith("word_embeddings.weight"))
    assert torch.equal(model.get_input_embeddings().weight, embedding.float())  # the export carries the average
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_weights_are_normalised_and_applied_oldest_first(run, tmp_path):
    rc, out, err = average_run(run, tmp_path / "w", "--last", "3", "--weights", "0,1,3")
    assert rc == 0, err
    assert json.loads(out)["weights"] == [0.0, 0.25, 0.75]
    _, b, c = (weights_of(p) for p in iteration_dirs(run / "checkpoints"))
    for key, value in weights_of(iteration_dirs(tmp_path / "w")[0]).items():
        assert torch.equal(value, (0.25 * b[key].float() + 0.75 * c[key].float()).to(value.dtype)), key


def test_a_disk_that_refuses_the_write_is_one_line_naming_the_output(run, tmp_path):
    """The kernel refuses the checkpoint's files past 64 KiB (a file-size limit: torch's writer then fails as on a
    full disk, a file ending short): one line naming the output, the reason and the space left, not DCP's per-rank
    traceback, and nothing left there."""
    import resource
    import signal

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    proc = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "average", str(run),
                           str(tmp_path / "avg"), "--last", "2", "--json"], capture_output=True, text=True,
                          timeout=600, preexec_fn=limited)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"kaiyuan: error: {tmp_path / 'avg'}: cannot write the average (") and \
        last.endswith(" MiB free there); nothing was left there"), proc.stderr
    assert "Traceback" not in proc.stderr and "[rank0]" not in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == [] and proc.stdout == ""


def test_bad_requests_are_named(run, tmp_path, capsys):
    rc, _, err = average(capsys, run, tmp_path / "x", "--last", "4")
    assert rc == 2 and "3 checkpoint(s)" in err and "--last 4 needs 4" in err and "kaiyuan.average_last=4" in err
    rc, _, err = average(capsys, run, tmp_path / "x", "--last", "2", "--weights", "1,2,3")
    assert rc == 2 and "--weights: 3 value(s) for --last 2" in err
    with pytest.raises(SystemExit):
        average(capsys, run, tmp_path / "x", "--last", "2", "--weights", "a,b")
    assert "'a,b': expected comma-separated numbers" in capsys.readouterr().err
    (tmp_path / "exists").mkdir()
    rc, _, err = average(capsys, run, tmp_path / "exists", "--last", "2")
    assert rc == 2 and "exists; choose a new output directory" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("weights, named", [("nan,1", "--weights: nan for iter_0000004"),
                                            ("1,inf", "--weights: inf for iter_0000006"),
                                            ("-1,2", "--weights: -1.0 for iter_0000004"),
                                            ("1,-inf", "--weights: -inf for iter_0000006")])
def test_weights_that_are_not_finite_non_negative_numbers_are_named(run, tmp_path, capsys, weights, named):
    rc, _, err = average(capsys, run, tmp_path / "x", "--last", "2", f"--weights={weights}")
    assert rc == 2 and err == f"kaiyuan: error: {named} is not a finite non-negative number\n", err
    assert not (tmp_path / "x").exists()


def test_all_zero_weights_are_refused_and_huge_ones_normalise(run, tmp_path, capsys):
    from kaiyuan_recipes.export.average import choose_checkpoints

    rc, _, err = average(capsys, run, tmp_path / "x", "--last", "2", "--weights", "0,0")
    assert rc == 2 and "--weights 0.0,0.0: all zero" in err
    assert choose_checkpoints(run, 2, [1e308, 1e308])[1] == [0.5, 0.5]  # their sum overflows to inf
    assert choose_checkpoints(run, 3, [1.7e308, 0, 1.7e308])[1] == [0.5, 0.0, 0.5]
    assert choose_checkpoints(run, 2, [5e-324, 5e-324])[1] == [0.5, 0.5]  # the smallest subnormals


def test_an_output_inside_a_runs_checkpoints_is_refused(run, tmp_path, capsys):
    """Inside checkpoints/, the average's iter_* would count among the run's saves: keep-last-K keeps it as the
    newest and deletes a real one."""
    from kaiyuan_recipes.config.run_layout import RunLayout

    fresh = tmp_path / "fresh_run"  # a run that has saved nothing yet: its checkpoints/ is still empty
    RunLayout(fresh).state.mkdir(parents=True)
    RunLayout(fresh).checkpoints.mkdir()
    for out in (run / "checkpoints" / "iter_0000099", run / "checkpoints" / "averaged",
                run / "checkpoints" / "iter_0000006" / "avg", fresh / "checkpoints" / "avg" / "deeper"):
        rc, _, err = average(capsys, run, out, "--last", "2")
        assert rc == 2 and f"{out}: inside " in err and "a run's checkpoints" in err, err
        assert not out.exists()
    assert [p.name for p in iteration_dirs(run / "checkpoints")] == ["iter_0000002", "iter_0000004", "iter_0000006"]
