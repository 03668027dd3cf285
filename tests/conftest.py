import os
import tempfile

import pytest

# Offline by construction: nothing in the CPU suite may reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The bundled tokenizer and the tokenized sample corpus go to a cache made for this test session.
os.environ.setdefault("KAIYUAN_CACHE", tempfile.mkdtemp(prefix="kaiyuan-test-cache-"))


@pytest.fixture(scope="module")
def megatron_parallel():
    """megatron-core's parallel state in this one process (gloo on the CPU, NCCL on a GPU), for real
    model construction. Torn down after the module: an initialised process group changes what world
    size upstream sees."""
    from kaiyuan_recipes import compat

    compat.apply()
    import torch
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    cuda = torch.cuda.is_available()
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    if cuda:
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1234)
    yield parallel_state
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
