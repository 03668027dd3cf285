"""The `kaiyuan:` section of a recipe: our own settings, beside Megatron-Bridge's ConfigContainer sections.

One typed dataclass; each field's documentation is here and only here. The README's knob table is generated
from it (`python -m kaiyuan_recipes.config.knobs --write README.md`; tests/test_knobs.py fails when they
differ), and recipes/_base/*.yaml set every field's recipe default (tested to equal the fields)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

AUTO = "auto"  # decided on the final config (fastpath/decisions.py)
LAYER_SPECS = ("auto", "local", "fast", "transformer_engine")
SDPA_BACKENDS = ("auto", "cudnn", "flash", "efficient")
DATA_SOURCES = ("sample", "mock", "blend", "curriculum", "plan")
ZERO_STAGE_CHOICES = (0, 1, 2)
TRI_STATE = (True, False, AUTO)


class KnobError(ValueError):
    pass


def knob(default: Any, doc: str, choices: tuple | None = None) -> Any:
    return field(default=default, metadata={"doc": doc, "choices": choices})


@dataclass
class Knobs:
    # Parallelism and layer spec
    zero_stage: int = knob(1, "0 = plain DDP; 1 = distributed optimizer (optimizer state sharded); 2 = optimizer "
                              "state and gradients sharded (Megatron-FSDP).", ZERO_STAGE_CHOICES)
    layer_spec: str = knob(AUTO, "auto: Transformer Engine's spec where TE imports; without TE the fast spec on a CUDA "
                                 "host, Megatron's local spec on a CPU host or with deterministic. `fast` runs where "
                                 "TE imports too (the two compared: benchmarks/README.md, Transformer Engine).",
                           LAYER_SPECS)
    deterministic: bool = knob(False, "Bit-reproducible training (Megatron's deterministic_mode, unfused "
                                      "cross-entropy, a fixed NCCL algorithm); slower.")
    # The fast path's pieces (fastpath/decisions.py decides each on the final config; the dry run shows why)
    chunked_loss: bool | str = knob(AUTO, "Tensor parallel 1: cross-entropy chunk by chunk from the output layer's "
                                          "input; the [tokens, vocab] logits are never materialised. auto = on for "
                                          "the fast and TE specs; true = on every spec (one output layer on all).",
                                    TRI_STATE)
    sdpa_backend: str = knob(AUTO, "Fast spec: the SDPA kernels tried first (the rest stay as fallbacks).",
                             SDPA_BACKENDS)
    compiled_norm: bool = knob(True, "Fast spec: RMSNorm compiled (one fused kernel each way) instead of torch's.")
    swiglu_backward: bool = knob(True, "Fast spec: SwiGLU's backward as one Triton kernel (CUDA hosts with Triton).")
    fused_adamw: bool = knob(True, "Fast spec: torch's fused AdamW step (one kernel) instead of the foreach one; "
                                   "off under deterministic, for another optimizer or CPU offload, "
                                   "and where TE/Apex imports (megatron-core steps their FusedAdam).")
    foreach_grad_clip: bool = knob(True, "Without Apex/TE: gradient norm and clipping through torch's foreach "
                                         "kernels instead of one host sync per parameter.")
    cuda_graph: bool | str = knob(AUTO, "Each step captured once as a CUDA graph and replayed. auto = on for the "
                                        "fast spec at ZeRO 0/1, dense, no TP/PP.", TRI_STATE)
    wgrad_fusion: bool | str = knob(AUTO, "Weight gradients accumulated straight into the fp32 main grad (fast "
                                          "spec, ZeRO 0/1). auto = with the CUDA graph.", TRI_STATE)
    # Where the run lives
    run_root: str = knob("./runs", "Runs live in <run_root>/<run_name>/ (layout: "
                                   "kaiyuan_recipes/config/run_layout.py).")
    run_name: str | None = knob(None, "Default: the recipe name.")
    average_last: int = knob(0, "Keep at least this many newest checkpoints for `kaiyuan average RUN --last N` "
                                "(raises checkpoint.most_recent_k to it; 0 = keep-last-K as set).")
    # Data
    data: str | list = knob("sample", "A directory `kaiyuan data convert` wrote, or a list `[DIR1,DIR2]` (weighed "
                                      "by tokens; the tokenizer from its manifest); sample: the bundled corpus; mock: "
                                      "synthetic tokens; blend: dataset.blend; curriculum: a phase of "
                                      "kaiyuan.curriculum; plan: kaiyuan.plan.")
    data_weights: list | None = knob(None, "data=DIRs: one weight per directory; null = by tokens.")
    tokenizer: str | None = knob(None, "A Hugging Face tokenizer directory. null: data=DIR trains with the "
                                       "tokenizer its manifest records, sample with the bundled Qwen2 one; blend, "
                                       "curriculum, plan and mock with Megatron's NullTokenizer(151643) over the "
                                       "converted ids (EOD 151643, Qwen2's), checked against the data's manifests.")
    tokenizer_sha256: str | None = knob(None, "Checked against the tokenizer's tokenizer.json when given.")
    plan: str | None = knob(None, "data=plan: a category blend plan (a name under recipes/plans or a YAML).")
    curriculum: str | None = knob(None, "data=curriculum: a name under recipes/curricula or a YAML.")
    phase: int | None = knob(None, "data=curriculum: the phase to train (`kaiyuan train … --phase N`).")
    heldout: str | None = knob(None, "A held-out validation prefix (`kaiyuan data heldout`); null = split from "
                                     "the blend.")
    heldout_eval: str | None = knob(None, "A prompt/completion JSONL (`kaiyuan data heldout`; what `kaiyuan eval "
                                          "heldout` reads) scored on the model during training: NLL, PPL, bits per "
                                          "byte and MCQ accuracy per dimension, in TensorBoard and `kaiyuan status`.")
    heldout_eval_interval: int | None = knob(None, "Iterations between held-out evaluations; null = "
                                                   "validation.eval_interval.")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(Knobs):
            if f.name in ("data", "data_weights"):
                continue  # a source name or directories; weights: checked below
            value = _coerced(f, getattr(self, f.name))
            _check(f, value)
            setattr(self, f.name, value)
        self._check_data()
        if self.average_last < 0:
            raise KnobError(f"kaiyuan.average_last: expected 0 or a positive number of checkpoints; got "
                            f"{self.average_last}")
        if self.run_name == "":
            self.run_name = None  # `kaiyuan.run_name=`: the recipe's name, as before
        if self.tokenizer_sha256 is not None:
            self.tokenizer_sha256 = self.tokenizer_sha256.lower()  # as hashing tools print it, either case
        if self.run_name is not None and ("/" in self.run_name or self.run_name in {".", ".."}):
            raise KnobError(f"kaiyuan.run_name: {self.run_name!r} must be a plain directory name")
        if self.heldout_eval_interval is not None and self.heldout_eval_interval < 1:
            raise KnobError(f"kaiyuan.heldout_eval_interval: expected a positive number of iterations or null; got "
                            f"{self.heldout_eval_interval}")
        if self.heldout_eval == "":
            self.heldout_eval = None  # `kaiyuan.heldout_eval=`: off
        if self.phase is not None and self.phase < 1:
            raise KnobError(f"kaiyuan.phase: expected a phase number from 1, got {self.phase}")
        if self.tokenizer_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.tokenizer_sha256):
            raise KnobError("kaiyuan.tokenizer_sha256: expected 64 lowercase hex digits, "
                            f"got {self.tokenizer_sha256!r}")

    @property
    def data_dirs(self) -> list[str] | None:
        """kaiyuan.data as converted directories (None: a named source)."""
        if isinstance(self.data, str) and self.data in DATA_SOURCES:
            return None
        return [self.data] if isinstance(self.data, str) else list(self.data)

    def _check_data(self) -> None:
        data = self.data
        if isinstance(data, (list, tuple)):
            data = list(data)
            if not data or not all(isinstance(d, str) and d for d in data):
                raise KnobError(f"kaiyuan.data: a list must name converted directories; got {data!r}")
            self.data = data[0] if len(data) == 1 else data
        elif not isinstance(data, str) or not data:
            raise KnobError(f"kaiyuan.data: expected one of {', '.join(DATA_SOURCES)}, a directory `kaiyuan data "
                            f"convert` wrote or a list of them; got {data!r}")
        weights = self.data_weights
        if weights is None:
            return
        if self.data_dirs is None:
            raise KnobError(f"kaiyuan.data_weights: weighs converted directories (kaiyuan.data=[DIR1,DIR2]), not "
                            f"kaiyuan.data={self.data}")
        if not isinstance(weights, (list, tuple)):
            weights = [weights]
        try:
            self.data_weights = [float(w) for w in weights if not isinstance(w, bool)]
        except (TypeError, ValueError):
            raise KnobError(f"kaiyuan.data_weights: expected numbers, got {weights!r}") from None
        if len(self.data_weights) != len(weights) or len(weights) != len(self.data_dirs):
            raise KnobError(f"kaiyuan.data_weights: {weights!r} for {len(self.data_dirs)} director"
                            f"{'y' if len(self.data_dirs) == 1 else 'ies'}; give one positive number per directory")
        if not all(math.isfinite(w) and w > 0 for w in self.data_weights):
            raise KnobError(f"kaiyuan.data_weights: {weights!r}: each must be a positive finite number")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "Knobs":
        names = [f.name for f in dataclasses.fields(Knobs)]
        for key in values:
            if key not in names:
                match = difflib.get_close_matches(key, names, n=1)
                raise KnobError(f"unknown knob kaiyuan.{key}" + (f"; closest: kaiyuan.{match[0]}" if match else ""))
        return cls(**values)

    def knob_values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Knobs)}


def _expected_type(f: dataclasses.Field) -> tuple[type, ...]:
    text = str(f.type)
    kinds = tuple(t for name, t in (("bool", bool), ("int", int), ("str", str)) if name in text)
    return kinds + ((type(None),) if "None" in text else ())


_TRUE, _FALSE = {"true", "1"}, {"false", "0"}


def _coerced(f: dataclasses.Field, value: Any) -> Any:
    """What a YAML, a command line or an ${oc.env:...} interpolation (always a string) means by the value: 0 / 1
    and "true" / "false" for a switch, "2" for a number. Anything else is left for _check to refuse."""
    kinds = _expected_type(f)
    if bool in kinds:
        if type(value) is int and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
    if int in kinds and bool not in kinds and isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def _check(f: dataclasses.Field, value: Any) -> None:
    choices = f.metadata.get("choices")
    if choices is not None:
        if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
            shown = ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)
            raise KnobError(f"kaiyuan.{f.name}: expected one of {shown}; got {value!r}")
        return
    kinds = _expected_type(f)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise KnobError(f"kaiyuan.{f.name}: expected {names}; got {value!r} ({type(value).__name__})")


def _shown(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def knob_table() -> str:
    """The README's table of knobs, from the dataclass."""
    rows = ["| knob | default | choices | what it does |", "|---|---|---|---|"]
    for f in dataclasses.fields(Knobs):
        choices = f.metadata.get("choices")
        shown = " / ".join(_shown(c) for c in choices) if choices else ""
        rows.append(f"| `{f.name}` | `{_shown(f.default)}` | {shown} | {f.metadata['doc']} |")
    return "\n".join(rows) + "\n"


BEGIN, END = "<!-- knobs:begin -->", "<!-- knobs:end -->"


def with_knob_table(markdown: str) -> str:
    """`markdown` with the text between the knob markers replaced by the current table."""
    if BEGIN not in markdown or END not in markdown:
        raise KnobError(f"no {BEGIN} ... {END} section to write the knob table into")
    head, rest = markdown.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{knob_table()}{END}{rest.split(END, 1)[1]}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(with_knob_table(path.read_text()))
        return 0
    sys.stdout.write(knob_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
