"""The `kaiyuan` command's messages to a user: user text printed as is, one-line errors, help texts
(a real subprocess, as a user runs it)."""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def kaiyuan(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


MARKUP_LOOKALIKE = "see [/usr/bin] and [bold red]alert[/bold red]"


def test_dry_run_table_prints_a_blend_path_in_brackets_as_is():
    # data on another host (a cluster path): the dry run says so in one line and passes
    out = kaiyuan("train", "gpt_smoke", "--dry-run", "kaiyuan.data=blend",
                  "dataset.blend=[[/data/x/web_part-00000_text_document],null]")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "prefixes: ['/data/x/web_part-00000_text_document']" in out.stdout
    assert "note: the data (1 prefix(es), e.g. /data/x/web_part-00000_text_document) is not on this host" in " ".join(
        out.stdout.replace("│", " ").split()), out.stdout


def test_data_inspect_prints_a_document_with_markup_lookalikes_as_is(tmp_path):
    path = tmp_path / "doc.parquet"
    pq.write_table(pa.table({"text": [MARKUP_LOOKALIKE]}), path)
    out = kaiyuan("data", "inspect", str(path), env={**os.environ, "COLUMNS": "400"})  # no wrapped cells
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[/usr/bin]" in out.stdout and "[bold red]alert[/bold red]" in out.stdout


def test_export_into_an_existing_directory_is_one_error_line(tmp_path):
    (tmp_path / "hf").mkdir()
    out = kaiyuan("export", "hf", str(tmp_path / "run"), str(tmp_path / "hf"))
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip() == f"kaiyuan: error: {tmp_path / 'hf'}: exists; choose a new output directory"
    out = kaiyuan("export", "megatron", str(tmp_path / "run"), str(tmp_path / "hf"), "--recipe", "gpt_smoke")
    assert out.returncode == 2 and out.stderr.startswith("kaiyuan: error: ") and "Traceback" not in out.stderr


def test_an_override_without_a_value_after_an_option_is_named():
    out = kaiyuan("train", "gpt_smoke", "--dry-run", "train.train_iters")
    assert out.returncode == 2
    assert out.stderr == "kaiyuan: error: override 'train.train_iters': expected section.field=value\n"
    out = kaiyuan("train", "gpt_smoke", "--dry-run", "--bogus")
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr


def test_start_dry_run_on_this_node_points_to_train_dry_run():
    out = kaiyuan("start", "gpt_smoke", "r1", "--dry-run")
    assert out.returncode == 2 and "kaiyuan train gpt_smoke --dry-run" in out.stderr, out.stderr


def test_every_argument_of_every_command_has_help():
    import argparse

    from kaiyuan_recipes.cli.main import build_parser

    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "kaiyuan")
    assert not missing, missing
    heldout = kaiyuan("data", "heldout", "--help").stdout
    assert "JSONL" in heldout and "english_dialogue" in heldout and "(default 400)" in heldout
