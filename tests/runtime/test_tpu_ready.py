"""The TPU configs' train steps compile with XLA (static shapes, no ops XLA refuses)."""

import importlib
import os
import sysconfig

import keras
import pytest
import tensorflow as tf

from trainer.task import get_task
from support import tiny_config
from trainer import Trainer
from trainer.runtime.precision import set_policy


@pytest.mark.parametrize("name,batch,accumulation", [("cifar_tpu", 8, 2), ("lm_tpu", 2, 1)])
def test_tpu_config_train_step_compiles_with_xla(tmp_path, name, batch, accumulation):
    """cifar_tpu also with gradient accumulation: the compiled pass inside its loop."""
    config = importlib.import_module(f"configs.{name}").get_config()
    assert config.trainer.jit_compile and config.precision == "mixed_bfloat16"
    config.distribution.strategy = "default"  # the model and step as on TPU, on the CPU
    config.data.global_batch_size = batch
    if name == "cifar_tpu":
        config.data = tiny_config(**{"data.global_batch_size": batch}).data
    else:
        # the real config's tokenizer and mask on local text (it reads shards on gs://)
        config.data.update(train="stdlib", prepared="", max_bytes=200_000, eval=os.path.join(
            sysconfig.get_paths()["stdlib"], "textwrap.py"))
        config.tokenizer.vocab_size = 1000
        # Every layer is the same Block: two compile the same ops as twelve, in a
        # fraction of the CPU time (shapes, dtypes, dropout and remat stay the TPU's).
        config.model.num_layers = 2
    config.trainer.update(train_steps=2, steps_per_loop=2, log_every=2, checkpoint_every=2,
                          accumulation_steps=accumulation)
    config.optimizer.warmup_steps = 1
    set_policy(config.precision, tf.distribute.get_strategy())
    keras.utils.set_random_seed(0)
    trainer = Trainer(config, get_task(config), tf.distribute.get_strategy(),
                      str(tmp_path))
    iterator = iter(trainer.distributed_dataset("train"))
    features, labels = next(iterator)
    if accumulation > 1:  # [accumulation, batch, ...]: one micro-batch is compiled
        assert features.shape[0] == accumulation
        features, labels = features[0], labels[0]
    # The XLA program exists only if every op compiles and every shape is static.
    hlo = trainer._compute_gradients.experimental_get_compiler_ir(
        features, labels, None)(stage="hlo")
    assert "bf16" in hlo
    trainer.train_loop(iterator, tf.constant(2, tf.int64))
    assert int(trainer.step.numpy()) == 2 and trainer.loss_scale.skipped_steps.numpy() == 0
