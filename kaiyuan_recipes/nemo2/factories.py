"""NeMo 2 factories for `nemo.collections.llm.api.pretrain`, registered in NeMo-Run's CLI catalogue when the
`nemo_run.cli` entry point `kaiyuan` loads this module:

    nemo llm pretrain --factory kaiyuan_qwen3 trainer.max_steps=10 data.global_batch_size=16 --dryrun -y

One source of truth: the model config from recipes/<name>/model.yaml, optimizer and schedule from the
merged hparams, data from the phase-blend module (or the bundled sample corpus) with the bundled tokenizer,
checkpoint retention and TensorBoard through NeMo's logger. The trainer, logger and resume pieces are
NeMo's own recipe helpers."""


from typing import Any, Optional

import nemo_run as run
from omegaconf import OmegaConf

from kaiyuan_recipes import compat
from kaiyuan_recipes.config.recipe_tree import load_recipe_tree
from kaiyuan_recipes.models.shape import ModelShape
from kaiyuan_recipes.nemo2.nemo_stack import (
    AutoTokenizer,
    MegatronOptimizerModule,
    OptimizerConfig,
    WarmupHoldAnnealScheduler,
    default_log,
    default_resume,
    llm,
    pretrain,
    qwen3_trainer,
    tensorboard_logger,
)


def model_config(recipe: str) -> run.Config:
    """NeMo 2's Qwen3Config (QK-norm) or GPTConfig with the recipe's model shape, nothing else."""
    return ModelShape.for_recipe(recipe).nemo2_config()


def model(recipe: str) -> run.Config:
    module = llm.Qwen3Model if ModelShape.for_recipe(recipe).get("qk_layernorm") else llm.GPTModel
    return run.Config(module, config=model_config(recipe))


def optimizer(hp: dict[str, Any], max_steps: int, use_distributed_optimizer: bool = True) -> run.Config:
    """The recipe's AdamW and warmup-stable-decay schedule (linear decay over the last lr_wsd_decay_iters)."""
    opt, sched = hp["optimizer"], hp["scheduler"]
    warmup = min(int(sched["lr_warmup_iters"]), max_steps)
    decay = min(int(sched.get("lr_wsd_decay_iters") or max_steps), max_steps - warmup)
    config = run.Config(OptimizerConfig, optimizer="adam", lr=opt["lr"], min_lr=opt["min_lr"],
                        weight_decay=opt["weight_decay"], adam_beta1=opt["adam_beta1"], adam_beta2=opt["adam_beta2"],
                        clip_grad=opt["clip_grad"], bf16=True, use_distributed_optimizer=use_distributed_optimizer)
    scheduler = run.Config(WarmupHoldAnnealScheduler, warmup_ratio=warmup / max_steps,
                           hold_ratio=(max_steps - warmup - decay) / max_steps, max_steps=max_steps,
                           decay_schedule="linear", min_lr=opt["min_lr"])
    return run.Config(MegatronOptimizerModule, config=config, lr_scheduler=scheduler)


def data(recipe: str, hp: dict[str, Any], seq_length: int, global_batch_size: int, micro_batch_size: int,
         curriculum: Optional[str], phase: Optional[int]) -> run.Config:
    """Weighted paths ([w1, prefix1, w2, prefix2, …]) from the phase-blend module, or the bundled sample corpus."""
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    tokenizer = run.Config(AutoTokenizer, pretrained_model_name=str(default_tokenizer_dir()))
    if curriculum:
        from kaiyuan_recipes.data.phase_module import PhaseBlendDataModule

        prefixes, weights = PhaseBlendDataModule(curriculum=curriculum, phase=int(phase or 1)).blend_fields()["blend"]
    else:
        from kaiyuan_recipes.data.sample_corpus import prepare_sample_corpus

        prefixes, weights = prepare_sample_corpus(default_tokenizer_dir())
    paths = [x for w, p in zip(weights, prefixes) for x in (float(w), p)]
    return run.Config(llm.PreTrainingDataModule, paths=paths, seq_length=seq_length, tokenizer=tokenizer,
                      global_batch_size=global_batch_size, micro_batch_size=micro_batch_size,
                      seed=hp["dataset"].get("random_seed", 1234), split=hp["dataset"].get("split", "99,1,0"),
                      num_workers=2)


def pretrain_partial(recipe: str, dir: Optional[str], name: str, num_nodes: int, num_gpus_per_node: int,
                     max_steps: Optional[int], global_batch_size: Optional[int], micro_batch_size: Optional[int],
                     tensor_parallelism: int, curriculum: Optional[str], phase: Optional[int]) -> run.Partial:
    hp = OmegaConf.to_container(load_recipe_tree(recipe), resolve=True)
    max_steps = int(max_steps or hp["train"]["train_iters"])
    seq = int(hp["dataset"]["seq_length"])
    trainer = qwen3_trainer(tensor_parallelism=tensor_parallelism, num_nodes=num_nodes,
                            num_gpus_per_node=num_gpus_per_node, max_steps=max_steps,
                            val_check_interval=int(hp["validation"]["eval_interval"]),
                            limit_val_batches=int(hp["validation"]["eval_iters"]),
                            log_every_n_steps=int(hp["logger"].get("log_interval", 10)))
    log = default_log(dir=dir, name=name, tensorboard_logger=tensorboard_logger(name=name))
    # Keep the K newest, as the Bridge recipes do (most_recent_k): NeMo's default monitor, val_loss, keeps the K
    # best and saves none between validations.
    log.ckpt.save_top_k = int(hp["checkpoint"]["most_recent_k"])
    log.ckpt.monitor, log.ckpt.mode = "step", "max"
    log.ckpt.every_n_train_steps = int(hp["checkpoint"]["save_interval"])
    log.ckpt.train_time_interval = None
    # The last save keeps the optimizer state, as the Bridge recipes' does: NeMo's default writes it weights-only,
    # and a longer run or the next phase restarted from it fails (optimizer.state.* not in the checkpoint).
    log.ckpt.save_optim_on_train_end = True
    return run.Partial(
        pretrain,
        model=model(recipe),
        trainer=trainer,
        data=data(recipe, hp, seq, int(global_batch_size or hp["train"]["global_batch_size"]),
                  int(micro_batch_size or hp["train"]["micro_batch_size"]), curriculum, phase),
        log=log,
        optim=optimizer(hp, max_steps, compat.nemo2_distributed_optimizer_saves()),
        resume=default_resume(),
    )


@run.cli.factory(target=pretrain, name="kaiyuan_qwen3")
def kaiyuan_qwen3(dir: Optional[str] = None, name: str = "kaiyuan_qwen3", num_nodes: int = 1,
                  num_gpus_per_node: int = 8, max_steps: Optional[int] = None,
                  global_batch_size: Optional[int] = None, micro_batch_size: Optional[int] = None,
                  tensor_parallelism: int = 1, curriculum: Optional[str] = None,
                  phase: Optional[int] = None) -> run.Partial:
    """qwen3_1p7b (recipes/qwen3_1p7b) on NeMo 2."""
    return pretrain_partial("qwen3_1p7b", dir, name, num_nodes, num_gpus_per_node, max_steps, global_batch_size,
                            micro_batch_size, tensor_parallelism, curriculum, phase)


@run.cli.factory(target=pretrain, name="kaiyuan_gpt_smoke")
def kaiyuan_gpt_smoke(dir: Optional[str] = None, name: str = "kaiyuan_gpt_smoke", num_nodes: int = 1,
                      num_gpus_per_node: int = 1, max_steps: Optional[int] = None,
                      global_batch_size: Optional[int] = None, micro_batch_size: Optional[int] = None,
                      tensor_parallelism: int = 1, curriculum: Optional[str] = None,
                      phase: Optional[int] = None) -> run.Partial:
    """gpt_smoke (recipes/gpt_smoke) on NeMo 2."""
    return pretrain_partial("gpt_smoke", dir, name, num_nodes, num_gpus_per_node, max_steps, global_batch_size,
                            micro_batch_size, tensor_parallelism, curriculum, phase)


# Executors from [launch] for `run.executor=`-style selection on the same command line:
#   nemo llm pretrain --factory kaiyuan_qwen3 run.executor=kaiyuan_local run.executor.ntasks_per_node=8
#   nemo llm pretrain --factory kaiyuan_qwen3 run.executor=kaiyuan_ssh run.executor.hosts=gpu1,gpu2 \
#       run.executor.container=kaiyuan
#   nemo llm pretrain --factory kaiyuan_qwen3 run.executor=kaiyuan_slurm run.executor.partition=batch \
#       run.executor.nodes=4 run.executor.account=A
@run.cli.factory(name="kaiyuan_local")
def kaiyuan_local(nproc_per_node: int = 8) -> run.Config[run.Executor]:
    """NeMo-Run's LocalExecutor with torchrun: nproc_per_node processes on this node."""
    return run.Config(run.LocalExecutor, ntasks_per_node=nproc_per_node, launcher="torchrun")


@run.cli.factory(name="kaiyuan_ssh")
def kaiyuan_ssh(hosts: str = "", gpus_per_node: int = 8, container: Optional[str] = None) -> run.Config[run.Executor]:
    """One torchrun per host over SSH (kaiyuan_recipes.launch.ssh); run.executor.hosts=h1,h2 (the first is
    the master)."""
    from kaiyuan_recipes.launch.nemo_run_executors import SSHMultiNodeExecutor

    return run.Config(SSHMultiNodeExecutor, hosts=hosts, gpus_per_node=gpus_per_node,
                      container=container)


@run.cli.factory(name="kaiyuan_slurm")
def kaiyuan_slurm(partition: str = "batch", nodes: int = 1, gpus_per_node: int = 8, account: Optional[str] = None,
                  time: str = "04:00:00", container_image: Optional[str] = None, tunnel: str = "local",
                  cluster_run_dir: Optional[str] = None, signal_grace_s: int = 300) -> run.Config[run.Executor]:
    """NeMo-Run's SlurmExecutor as `kaiyuan start --slurm` builds it (kaiyuan_recipes.launch.slurm_executor):
    torchrun per node, --signal=TERM@signal_grace_s to the ranks, one log per node under the job's folder."""
    import os

    from kaiyuan_recipes.launch.slurm import SlurmSpec
    from kaiyuan_recipes.launch.slurm_executor import slurm_executor

    spec = SlurmSpec(partition=partition, nodes=nodes, gpus_per_node=gpus_per_node, account=account, time=time,
                     container_image=container_image, tunnel=tunnel, cluster_run_dir=cluster_run_dir,
                     signal_grace_s=signal_grace_s)
    return slurm_executor(spec, cluster_run_dir or os.getcwd()).to_config()
