"""docs/data.md's "Your own data" section, run as written: its commands, taken from the markdown itself, on a small
Chinese + English parquet folder on the CPU, up to the dry run and `kaiyuan data index` (`start` and `status` need a
GPU); each output block shown after a command block must appear in what those commands printed, so the section
cannot drift from what a user sees."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from kaiyuan_recipes.data.sample_corpus import CORPUS_DIR

ROOT = Path(__file__).resolve().parents[1]
SECTION = re.compile(r"^## Your own data\n(.*?)(?=^## )", re.M | re.S)
BLOCK = re.compile(r"^```(bash|text)\n(.*?)^```", re.M | re.S)
RUN_HERE = (("data", "inspect"), ("data", "convert"), ("data", "index"), ("train",))  # `start`, `status`: a GPU
TABLE = re.compile(r"[│┃┌┐└┘─┬┴├┤┼━┏┓┗┛]")


def section_blocks() -> list[tuple[str, str]]:
    text = SECTION.search((ROOT / "docs" / "data.md").read_text()).group(1)
    return BLOCK.findall(text)


def commands(block: str, variables: dict[str, str]) -> list[list[str]]:
    """The block's command lines as argvs (continuations joined, comments dropped, `k=...` kept as a variable)."""
    argvs = []
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if len(argv) == 1 and re.fullmatch(r"[A-Za-z_]\w*=\S+", argv[0]):
            variables[argv[0].split("=", 1)[0]] = argv[0].split("=", 1)[1]
        elif argv:
            argvs.append([variables.get(a[1:], a) if a.startswith("$") else a for a in argv])
    return argvs


def flat(text: str) -> str:
    """Table borders and wrapping gone: what a reader reads."""
    return " ".join(TABLE.sub(" ", text).split())


def test_the_section_is_first_and_shows_each_step():
    text = (ROOT / "docs" / "data.md").read_text()
    assert re.findall(r"^## .*", text, re.M)[0] == "## Your own data"
    shown = " ".join(b for _, b in section_blocks())
    for step in ("data convert", "kaiyuan.data=", "--dry-run", "data index", "start qwen3_1p7b", "status"):
        assert step in shown, step
    readme = (ROOT / "README.md").read_text()
    assert "docs/data.md#your-own-data" in readme[:3000], "linked from the README's first screen"


def test_the_own_data_section_runs_as_written(tmp_path):
    parquet = tmp_path / "my-parquet"
    parquet.mkdir()
    for name in ("en_jargon", "zh_poems"):  # English and classical Chinese, public domain
        shutil.copy(CORPUS_DIR / f"{name}.parquet", parquet / f"{name}.parquet")
    cli = [sys.executable, "-m", "kaiyuan_recipes.cli.main"]
    env = {**os.environ, "COLUMNS": "140", "PYTHONPATH": str(ROOT)}
    variables: dict[str, str] = {}
    output, ran, block_ran = "", 0, False
    for kind, block in section_blocks():
        if kind == "text":  # what the commands just above printed, abridged (… elides)
            if not block_ran:  # `start` / `status` on a GPU host: their output is shown, not checked here
                continue
            for line in block.splitlines():
                piece = flat(line)
                if piece and "…" not in piece:
                    assert piece in output, f"docs/data.md shows {line!r}; the commands printed:\n{output[-4000:]}"
            continue
        output, block_ran = "", False
        for argv in commands(block, variables):
            assert Path(argv[0]).name == "kaiyuan", f"only kaiyuan commands in the section: {argv}"
            args = argv[1:]
            if not any(tuple(args[:len(step)]) == step for step in RUN_HERE):
                continue
            done = subprocess.run(cli + args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f"{shlex.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}"
            output += flat((done.stdout + done.stderr).replace(str(tmp_path), "."))
            ran += 1
            block_ran = True
    assert ran >= 4  # convert, a dry run, data index and more ran from the markdown
