"""Keep-last-K with real checkpoint directories, through Megatron-Bridge's own cleanup, as the recipe
configures it (checkpoint.most_recent_k=3): the newest is never deleted, nor (megatron-bridge 0.6) an in-flight
newer save."""

import inspect

from kaiyuan_recipes import compat
from kaiyuan_recipes.config.recipe_tree import load_recipe_tree


def make_ckpts(root, iterations):
    for it in iterations:
        d = root / f"iter_{it:07d}"
        (d / "__0_0.distcp").parent.mkdir(parents=True)
        (d / "__0_0.distcp").write_bytes(b"x" * 16)
        (d / "metadata.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text(str(max(iterations)))


def remaining(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("iter_"))


def test_sync_save_keeps_newest_k(tmp_path):
    compat.apply()
    from megatron.bridge.training.checkpointing import cleanup_old_non_persistent_checkpoint

    k = load_recipe_tree("qwen3_1p7b").checkpoint.most_recent_k
    assert k == 3
    make_ckpts(tmp_path, [100, 200, 300, 400, 500])
    cleanup_old_non_persistent_checkpoint(str(tmp_path), leave_ckpt_num=k, do_async=False)
    assert remaining(tmp_path) == ["iter_0000300", "iter_0000400", "iter_0000500"]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "500"


def test_in_flight_newer_save_is_not_counted_or_deleted(tmp_path):
    compat.apply()
    from megatron.bridge.training.checkpointing import cleanup_old_non_persistent_checkpoint

    make_ckpts(tmp_path, [100, 200, 300, 400])
    in_flight = tmp_path / "iter_0000500"
    in_flight.mkdir()  # being written: no metadata yet, tracker still says 400
    if "max_iteration" not in inspect.signature(cleanup_old_non_persistent_checkpoint).parameters:
        # megatron-bridge 0.5.0 has no in-flight guard: the save being written counts as one of the K kept
        cleanup_old_non_persistent_checkpoint(str(tmp_path), leave_ckpt_num=3, do_async=False)
        assert remaining(tmp_path) == ["iter_0000300", "iter_0000400", "iter_0000500"]
        return
    cleanup_old_non_persistent_checkpoint(str(tmp_path), leave_ckpt_num=3, do_async=False, max_iteration=400)
    assert remaining(tmp_path) == ["iter_0000200", "iter_0000300", "iter_0000400", "iter_0000500"]
