"""How a world of ranks splits into tensor, pipeline, context and data parallelism, and how many micro-batches
make one global batch: plain arithmetic, used by the launching process on the recipe's values (before anything is
claimed) and by every full resolution on the built config (training/validate.py)."""

from __future__ import annotations


class LayoutError(ValueError):
    pass


def parallel_layout_of(tensor: int, pipeline: int, context: int, micro_batch: int, global_batch: int,
                       world_size: int) -> dict[str, int]:
    model_parallel = tensor * pipeline * context
    if world_size % model_parallel:
        raise LayoutError(f"world size {world_size} is not divisible by TP×PP×CP = {tensor}×{pipeline}×{context} = "
                          f"{model_parallel}")
    dp = world_size // model_parallel
    per_step = micro_batch * dp
    if global_batch % per_step:
        raise LayoutError(f"train.global_batch_size={global_batch} is not divisible by train.micro_batch_size × "
                          f"data-parallel size = {micro_batch} × {dp} = {per_step}")
    return {"world_size": world_size, "tensor": tensor, "pipeline": pipeline, "context": context, "data": dp,
            "grad_accumulation": global_batch // per_step}
