"""A checkpoint someone handed over runs no code in the tools that read it, and a damaged one gives one line naming
the file. Crafted checkpoints are copies of a real training checkpoint (tests/test_ckpt.py's writer) with one pickle
replaced by one that runs `touch MARKER` under plain pickle: `kaiyuan ckpt ls | inspect | verify | diff`,
`kaiyuan average` and `kaiyuan export hf` refuse it, name the file, and the marker never appears."""

import dataclasses
import io
import os
import pickle
import shutil

import pytest
import torch
from test_ckpt import zero1_run  # noqa: F401  (the session's real checkpoint)

from kaiyuan_recipes.cli.main import main

ITER = "iter_0000008"


class RunsCommand:
    """Pickles as os.system(f"touch {marker}"): what a crafted checkpoint would hold."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def copy_run(zero1_run, tmp_path):  # noqa: F811
    """A run directory holding a copy of iteration 8 (and its tracker)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(zero1_run / "checkpoints" / ITER, run / "checkpoints" / ITER)
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("8")
    return run, run / "checkpoints" / ITER


def trusted_metadata(ckpt):
    with open(ckpt / ".metadata", "rb") as fh:  # our own file, written by the test's writer
        return pickle.load(fh)


def craft_metadata(ckpt, marker):
    metadata = trusted_metadata(ckpt)
    metadata.planner_data = RunsCommand(marker)  # the rest stays a valid Metadata
    with open(ckpt / ".metadata", "wb") as fh:
        pickle.dump(metadata, fh)
    return ckpt / ".metadata"


def craft_object(ckpt, marker, prefix="common_state/"):
    """The common state's stored bytes replaced by a torch.save of the command (appended to its shard file, the
    metadata pointing at it): what megatron-core's loader unpickles with weights_only=False."""
    metadata = trusted_metadata(ckpt)
    index = next(i for i in metadata.storage_data if i.fqn.startswith(prefix))
    info = metadata.storage_data[index]
    payload = io.BytesIO()
    torch.save([RunsCommand(marker)], payload)
    shard = ckpt / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as fh:
        fh.write(payload.getvalue())
    metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(payload.getvalue()))
    with open(ckpt / ".metadata", "wb") as fh:
        pickle.dump(metadata, fh)
    return shard


def craft_train_state(ckpt, marker):
    torch.save({"step": RunsCommand(marker)}, ckpt / "train_state.pt")
    return ckpt / "train_state.pt"


def craft_legacy_common_state(ckpt, marker):
    torch.save({"iteration": RunsCommand(marker)}, ckpt / "common.pt")  # where megatron-core <= 0.18 keeps it
    return ckpt / "common.pt"


def run_cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def commands(run, ckpt, real, tmp_path):
    return {
        "ls": ["ckpt", "ls", run],
        "inspect": ["ckpt", "inspect", run],
        "verify": ["ckpt", "verify", ckpt],
        "diff": ["ckpt", "diff", ckpt, real],
        "diff_b": ["ckpt", "diff", real, ckpt],
        "average": ["average", run, tmp_path / "averaged", "--last", "1"],
        "export": ["export", "hf", run, tmp_path / "hf"],
    }


def test_upstream_dcp_metadata_reader_still_runs_a_crafted_pickle(zero1_run, tmp_path):  # noqa: F811
    """compat.restricted_dcp_metadata exists because torch's own FileSystemReader.read_metadata runs it."""
    from torch.distributed.checkpoint import FileSystemReader

    _, ckpt = copy_run(zero1_run, tmp_path)
    craft_metadata(ckpt, tmp_path / "MARKER")
    FileSystemReader(str(ckpt)).read_metadata()
    assert (tmp_path / "MARKER").exists()


def test_upstream_common_state_loader_still_runs_a_crafted_object(zero1_run, tmp_path):  # noqa: F811
    """Why average and export screen a checkpoint before megatron-core's loader sees it."""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict

    _, ckpt = copy_run(zero1_run, tmp_path)
    craft_object(ckpt, tmp_path / "MARKER")
    try:
        load_common_state_dict(str(ckpt))
    except Exception:
        pass  # os.system's return value is no state dict
    assert (tmp_path / "MARKER").exists()


# What each command does with each crafted file: refuse it (rc 2; verify reports it, rc 1) or not read it at all.
REFUSED = {
    ".metadata": (craft_metadata, {"ls", "inspect", "verify", "diff", "diff_b", "average", "export"}),
    "common_state object": (craft_object, {"inspect", "verify", "diff", "diff_b", "average", "export"}),
    "train_state.pt": (craft_train_state, {"ls", "inspect", "verify", "average", "export"}),
    "common.pt": (craft_legacy_common_state, {"inspect", "verify", "diff", "diff_b", "average", "export"}),
}


@pytest.mark.parametrize("crafted", list(REFUSED))
def test_a_crafted_checkpoint_is_refused_naming_the_file_and_runs_nothing(zero1_run, tmp_path, capsys, crafted):  # noqa: F811
    run, ckpt = copy_run(zero1_run, tmp_path)
    marker = tmp_path / "MARKER"
    craft, refusing = REFUSED[crafted]
    file = craft(ckpt, marker)
    real = zero1_run / "checkpoints" / ITER
    for name, argv in commands(run, ckpt, real, tmp_path).items():
        rc, out, err = run_cli(capsys, *argv)
        assert not marker.exists(), f"{name} ran the crafted {crafted}"
        if name not in refusing:
            assert rc in (0, 1) and "refused" not in err, (name, err)
            continue
        lines = err.strip().splitlines()
        if name == "verify" and rc == 1:  # a report: the first problem, then any others as `also:` lines
            lines = lines[:1]
        else:
            assert rc == 2, (name, rc, err)
        assert len(lines) == 1 and lines[0].startswith(f"kaiyuan: error: {file}: "), (name, err)
        assert "refused" in lines[0] and "posix.system" in lines[0], (name, err)
    assert not (tmp_path / "averaged").exists() and not (tmp_path / "hf").exists()


def test_the_real_checkpoint_passes_the_screen_and_every_command(zero1_run, tmp_path, capsys):  # noqa: F811
    from kaiyuan_recipes.ckpt.screen import screen_pickles

    run, ckpt = copy_run(zero1_run, tmp_path)
    screen_pickles(ckpt)
    for name, argv in commands(run, ckpt, zero1_run / "checkpoints" / ITER, tmp_path).items():
        if name in ("average", "export"):
            continue  # they build models (a process group): tests/test_average.py runs them on real checkpoints
        rc, out, err = run_cli(capsys, *argv)
        assert rc == 0, (name, err)


def test_a_pickle_that_is_no_metadata_is_named(zero1_run, tmp_path, capsys):  # noqa: F811
    run, ckpt = copy_run(zero1_run, tmp_path)
    with open(ckpt / ".metadata", "wb") as fh:
        pickle.dump(12, fh)
    for argv in (["ckpt", "ls", run], ["ckpt", "inspect", ckpt], ["ckpt", "diff", ckpt, ckpt]):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and err.strip() == (f"kaiyuan: error: {ckpt / '.metadata'}: holds a int without its entries "
                                           "and storage, not torch.distributed.checkpoint's Metadata"), err


def truncate_shard(ckpt):
    """Cut inside a model weight (the optimizer state after it goes too): what a copy that stopped early leaves."""
    info = next(i for idx, i in trusted_metadata(ckpt).storage_data.items()
                if idx.fqn == "decoder.layers.mlp.linear_fc2.weight")
    with open(ckpt / info.relative_path, "r+b") as fh:
        fh.truncate(info.offset + info.length // 2)
    return ckpt / info.relative_path


def overwrite_item(ckpt, prefix):
    """The stored bytes of the first entry whose key starts with `prefix`, zeroed (the file keeps its size)."""
    metadata = trusted_metadata(ckpt)
    info = next(i for idx, i in metadata.storage_data.items() if idx.fqn.startswith(prefix))
    with open(ckpt / info.relative_path, "r+b") as fh:
        fh.seek(info.offset)
        fh.write(b"\0" * min(64, info.length))
    return ckpt / info.relative_path


def replace_file(name, data):
    def damage(ckpt):
        (ckpt / name).write_bytes(data)
        return ckpt / name
    return damage


DAMAGED = {
    "truncated shard": truncate_shard,
    "garbled tensor": lambda ckpt: overwrite_item(ckpt, "decoder.layers.mlp.linear_fc2.weight"),
    "garbled common state": lambda ckpt: overwrite_item(ckpt, "common_state/"),
    "truncated .metadata": lambda ckpt: replace_file(".metadata", (ckpt / ".metadata").read_bytes()[:300])(ckpt),
    "run_config.yaml not YAML": replace_file("run_config.yaml", b"model: [unclosed\n  - : :\n"),
    "metadata.json not JSON": replace_file("metadata.json", b"{sharded_backend"),
    "train_state.pt not a pickle": replace_file("train_state.pt", b"PK\x03\x04 not a zip"),
}
# Damage only a model load finds (the tensors): `kaiyuan average` in its own process, as a user runs it.
FOUND_BY_LOADING = {"truncated shard", "garbled tensor"}
# Files a command does not read: inspect reads no tensor, diff no config and no train state.
NOT_READ = {("inspect", d) for d in FOUND_BY_LOADING} | {
    (c, d) for c in ("diff", "diff_b") for d in ("run_config.yaml not YAML", "metadata.json not JSON",
                                                 "train_state.pt not a pickle")}


def assert_one_line_naming(rc, err, file, command):
    lines = err.strip().splitlines()
    assert rc == 2 and "Traceback" not in err, (command, rc, err[-3000:])
    assert len(lines) == 1 and lines[0].startswith(f"kaiyuan: error: {file}"), (command, err[-3000:])


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_checkpoint_is_one_line_naming_the_file(zero1_run, tmp_path, capsys, damage):  # noqa: F811
    import subprocess
    import sys

    run, ckpt = copy_run(zero1_run, tmp_path)
    file = DAMAGED[damage](ckpt)
    real = zero1_run / "checkpoints" / ITER
    for name in ("inspect", "diff", "diff_b", "average"):
        argv = commands(run, ckpt, real, tmp_path)[name]
        if name == "average" and damage in FOUND_BY_LOADING:
            proc = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", *map(str, argv)],
                                  capture_output=True, text=True, timeout=600)
            rc, err = proc.returncode, "\n".join(line for line in proc.stderr.splitlines()
                                                 if line.startswith("kaiyuan: error:") or "Traceback" in line)
        else:
            rc, _, err = run_cli(capsys, *argv)
        if (name, damage) in NOT_READ:
            assert rc in (0, 1) and not err.strip(), (name, err)
            continue
        assert_one_line_naming(rc, err, file, name)
    assert not (tmp_path / "averaged").exists()


def test_metadata_that_points_outside_the_checkpoint_is_refused(zero1_run, tmp_path, capsys):  # noqa: F811
    run, ckpt = copy_run(zero1_run, tmp_path)
    metadata = trusted_metadata(ckpt)
    index = next(iter(metadata.storage_data))
    metadata.storage_data[index] = dataclasses.replace(metadata.storage_data[index], relative_path="../../../x")
    with open(ckpt / ".metadata", "wb") as fh:
        pickle.dump(metadata, fh)
    for argv in (["ckpt", "ls", run], ["ckpt", "verify", ckpt], ["ckpt", "diff", ckpt, ckpt]):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and err.strip() == (f"kaiyuan: error: {ckpt / '.metadata'}: places data outside the checkpoint "
                                           "directory (../../../x); not read"), err


def five_commands(run, ckpt, tmp_path):
    """Every reader of a checkpoint that fails before building a model (average refuses before its process group)."""
    return [["ckpt", "ls", run], ["ckpt", "inspect", ckpt], ["ckpt", "verify", ckpt], ["ckpt", "diff", ckpt, ckpt],
            ["average", run, tmp_path / "averaged", "--last", "1"]]


def write_metadata(ckpt, change):
    """The checkpoint's .metadata with change(metadata) applied: DCP's own classes only, so it unpickles."""
    metadata = trusted_metadata(ckpt)
    change(metadata)
    with open(ckpt / ".metadata", "wb") as fh:
        pickle.dump(metadata, fh)


def first_tensor(metadata):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return next(k for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata))


def unstore_first_chunk(metadata):
    fqn = first_tensor(metadata)
    del metadata.storage_data[next(i for i in metadata.storage_data if i.fqn == fqn)]


def chunk_past_its_tensor(metadata):
    entry = metadata.state_dict_metadata[first_tensor(metadata)]
    entry.chunks[0] = dataclasses.replace(entry.chunks[0], sizes=torch.Size(s + 1 for s in entry.chunks[0].sizes))


@pytest.mark.parametrize("change, said", [
    (lambda m: m.state_dict_metadata.__setitem__(first_tensor(m), "gone"), "{fqn}: a str, neither a tensor's nor "
                                                                            "an object's entry"),
    (unstore_first_chunk, "{fqn}: a chunk at (0, 0) stored nowhere"),
    (chunk_past_its_tensor, "{fqn}: a chunk that is not a region of its"),
])
def test_metadata_entries_not_as_dcp_writes_them_are_refused_naming_the_file(zero1_run, tmp_path, capsys,  # noqa: F811
                                                                             change, said):
    """Made of DCP's classes (so they unpickle), but a tensor's entry a string (verify said ok, the tensor gone),
    a chunk stored nowhere, a chunk past its tensor's end: every command refuses, naming .metadata and the entry."""
    run, ckpt = copy_run(zero1_run, tmp_path)
    write_metadata(ckpt, change)
    fqn = first_tensor(trusted_metadata(zero1_run / "checkpoints" / ITER))
    for argv in five_commands(run, ckpt, tmp_path):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and err.startswith(f"kaiyuan: error: {ckpt / '.metadata'}: {said.format(fqn=fqn)}"), (argv, err)
        assert err.strip().endswith("(a crafted or damaged file: not torch.distributed.checkpoint's metadata as it "
                                    "writes it)") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "averaged").exists()


def test_a_link_inside_a_checkpoint_is_refused_not_followed(zero1_run, tmp_path, capsys):  # noqa: F811
    """A shard moved elsewhere and linked back: each reader names the link (verify said ok, average read the file
    outside)."""
    run, ckpt = copy_run(zero1_run, tmp_path)
    shard = sorted(ckpt.glob("*.distcp"))[0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(shard, elsewhere / shard.name)
    shard.symlink_to(elsewhere / shard.name)
    for argv in five_commands(run, ckpt, tmp_path):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and err.startswith(f"kaiyuan: error: {shard}: a symbolic link (to {elsewhere / shard.name}) "
                                          "inside the checkpoint; its files are read only from the checkpoint "
                                          "directory itself: not followed"), (argv, err)
    assert not (tmp_path / "averaged").exists()


def test_an_iter_link_is_not_a_save_of_the_run(zero1_run, tmp_path, capsys):  # noqa: F811
    """An iter_* link to /etc is not walked (ckpt ls counted its 100+ MiB as an incomplete save)."""
    run, _ = copy_run(zero1_run, tmp_path)
    rc, before, _ = run_cli(capsys, "ckpt", "ls", run, "--json")
    (run / "checkpoints" / "iter_0000009").symlink_to("/etc")
    rc, after, err = run_cli(capsys, "ckpt", "ls", run, "--json")
    assert rc == 0 and after == before, err


def test_a_run_config_section_that_is_no_mapping_and_a_huge_tracker_are_named(zero1_run, tmp_path, capsys):  # noqa: F811
    run, ckpt = copy_run(zero1_run, tmp_path)
    config = ckpt / "run_config.yaml"
    config.write_text(config.read_text().replace("\nmodel:\n", "\nmodel:\n- 1\nmodel_was:\n", 1))
    for argv in (["ckpt", "ls", run], ["ckpt", "inspect", ckpt],
                 ["average", run, tmp_path / "averaged", "--last", "1"]):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and err == (f"kaiyuan: error: {config}: `model` is a list, not a section (a mapping) of "
                                   "Megatron-Bridge's run config\n"), (argv, err)
    shutil.copy2(zero1_run / "checkpoints" / ITER / "run_config.yaml", config)
    tracker = run / "checkpoints" / "latest_checkpointed_iteration.txt"
    tracker.write_text("9" * 5000)
    for argv in (["ckpt", "ls", run], ["ckpt", "inspect", run], ["ckpt", "verify", run]):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and err == (f"kaiyuan: error: {tracker}: a number of 5,000 digits, not an iteration (a damaged "
                                   "tracker file: write the iteration to resume from, or remove it)\n"), (argv, err)
