"""The Trainer: the model and all the state of a run, built under the strategy's scope,
and what the host calls between compiled steps (restore, warm start, evaluate).

The compiled train step and loop it runs are `trainer/step/train_step.py`;
evaluation is `trainer/step/evaluation.py`; the host loop around both (logging,
checkpoints, evaluation, stopping) `trainer/loop/controller.py`.
"""

import contextlib
import os
import time

import keras
import tensorflow as tf
from absl import logging

from trainer.runtime import debug, startup
from trainer.runtime.distribute import is_chief
from trainer.runtime.keras_internals import apply_gradients_as_given
from trainer.runtime.precision import (advise_shapes, check_float32_layers, layers_of, policy_name,
                                       use_float32_layers)
from trainer.runtime.settings import check_trainer_config, jit_setting, synchronizing_layers
from trainer.state.checkpoints import Checkpoints, async_checkpoint
from trainer.state.layout import optimizer_variables, variable_names
from trainer.state.model_build import build_model
from trainer.state.workdir import ChiefFiles
from trainer.step.accumulation import batch_micro_steps, check_accumulation_steps
from trainer.step.ema import EmaWeights, evaluates_ema
from trainer.step.evaluation import Evaluation, format_metrics
from trainer.step.flops import Utilization
from trainer.step.loss_scale import LossScale
from trainer.step.optimizers import build_optimizer, trained_variables
from trainer.step.step_variables import StepVariables
from trainer.step.telemetry import Telemetry, check_numerics_every
from trainer.step.train_step import TrainStep
from trainer.step.warm_start import warm_start


def _step_variable(name):
    """An int64 counter that every replica sees alike and only cross-replica code moves."""
    return tf.Variable(0, dtype=tf.int64, name=name, trainable=False,
                       synchronization=tf.VariableSynchronization.ON_WRITE,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def without_autotune_thread(dataset):
    """`dataset` without tf.data's autotuning model, whose thread an iterator's destructor
    waits for until its next optimization period: 6 to 17 s after the last step of a
    run here, in 2 runs of 3. Without it a map's AUTOTUNE parallelism is the cores' and
    a prefetch buffer still grows while the step waits for it (prefetch's own tuner):
    as fast here (docs/data.md#without-tfdatas-autotuning-model)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _clock_allowed():
    """Whether `tf.timestamp` runs: op determinism (`trainer.deterministic`, or enabled
    by anything else in the process, for good) refuses it."""
    try:
        tf.timestamp()
        return True
    except tf.errors.FailedPreconditionError:
        return False


class Trainer(TrainStep):
    """Trains and evaluates `task` under `strategy` as `config.trainer` says.

    Build the strategy and set the Keras precision policy first (see
    trainer/cli.py); the model, optimizer, loss scale and metrics are created here,
    under `strategy.scope()`.
    """

    def __init__(self, config, task, strategy, workdir):
        self.created = time.time()  # (a launch's start, after the first in a process)
        self.config = config
        self.task = task
        self.strategy = strategy
        self.workdir = workdir
        self.train_steps = int(config.trainer.train_steps)
        self.global_batch_size = int(config.data.global_batch_size)
        replicas = strategy.num_replicas_in_sync
        if self.global_batch_size <= 0 or self.global_batch_size % replicas:
            raise ValueError(
                f"data.global_batch_size={self.global_batch_size} must be a positive "
                f"multiple of the {replicas} replicas; set --config.data.global_batch_size "
                f"to a multiple of {replicas}.")
        check_trainer_config(config.trainer)
        debug.start(config.trainer, strategy)  # trainer.debug=eager: the steps run eagerly
        # An optimizer step reads `accumulation_steps` micro-batches of global_batch_size.
        self.accumulation_steps = check_accumulation_steps(
            config.trainer.accumulation_steps)
        self.examples_per_step = self.global_batch_size * self.accumulation_steps
        self.per_step_summaries = bool(config.trainer.per_step_summaries)
        self.clip_norm = config.optimizer.clip_norm
        self.all_reduce_dtype = config.distribution.all_reduce_dtype
        if config.trainer.deterministic:
            # With the step-derived input order of the tasks, this makes a resumed
            # run bitwise equal to an uninterrupted one (on CPU; slower kernels).
            tf.config.experimental.enable_op_determinism()
        self.times_input = _clock_allowed()  # (after determinism is set)
        float32_layers = tuple(config.precision_overrides.float32_layers)
        use_float32_layers(float32_layers)
        self.policy = policy_name()

        with strategy.scope():
            self.model = build_model(task)  # the same names in every build, built
            self.variable_names = variable_names(self.model)  # {name: variable}, all of them
            # What the optimizer updates: trainable float variables, less optimizer.freeze.
            trained = trained_variables(self.variable_names, config.optimizer)
            # Their roles in the step: trained (with or without a gradient), seeds, state.
            self.variables = StepVariables(
                self.variable_names, trained,
                constant=[v for layer in layers_of(self.model) if not layer.trainable
                          for v in layer.variables])
            self.trained_variables = self.variables.trained
            self.step = _step_variable("global_step")
            # Built now, not at the first apply, so that a restore fills the slots.
            self.optimizer = apply_gradients_as_given(
                build_optimizer(config.optimizer, self.train_steps, self.step, trained))
            # Evaluation (and so the best checkpoint) sees the EMA weights, if any.
            self.ema = (EmaWeights(self.trained_variables, self.optimizer)
                        if evaluates_ema(config) else None)
            self.loss_scale = LossScale(
                enabled=self.policy == "mixed_float16",
                dynamic=config.loss_scale.dynamic,
                initial_scale=config.loss_scale.initial_scale,
                growth_steps=config.loss_scale.growth_steps)
            self.nonfinite_streak = _step_variable("nonfinite_streak")  # not checkpointed
            self.train_metrics = [keras.metrics.Mean("loss")] + task.build_metrics()
            self.grad_norm = keras.metrics.Mean("grad_norm")
            self.evaluation = Evaluation(task, self.model, strategy)
            every = check_numerics_every(config.numerics.every)
            self.telemetry = (Telemetry(self.trained_variables,
                                        layers_of(self.model), every) if every else None)

        check_float32_layers(self.model, float32_layers)
        advise_shapes(self.model, {"per-replica batch": self.global_batch_size // replicas,
                                   "sequence length": task.tokens_per_example}, strategy)

        self.max_nonfinite_steps = int(config.trainer.max_nonfinite_steps or (
            100 if self.loss_scale.enabled else 1))
        self.is_chief = is_chief(strategy)
        self.checkpoints = Checkpoints(
            {"model": self.variable_names,
             "optimizer": optimizer_variables(self.optimizer, trained)},
            dict(loss_scale=self.loss_scale, step=self.step),
            os.path.join(workdir, "checkpoints"), self.step, config.trainer.max_to_keep,
            self.is_chief, async_save=async_checkpoint(config.trainer, strategy))
        jit = jit_setting(config.trainer, strategy, synchronizing_layers(layers_of(self.model))
                          if replicas > 1 else [])  # (one replica: an identity all-reduce)
        self.use_jit(jit is True)
        self.jit_compile = jit  # "auto": the Controller settles it before training
        self._eval_dataset = None  # built on the first evaluation, reused after
        self.example_spec = None  # one example's features (batch 1), seen by the trace
        self.utilization = Utilization(self)  # model FLOPs per step, MFU
        startup.mark("build")

    # ------------------------------------------------------- called by the host

    def train(self, evaluate=True, actions=()):
        """A convenience for `trainer.modes.train.train(self, evaluate, actions)`: trains
        to `train_steps` with the actions the config asks for; returns the last eval."""
        from trainer.modes import train  # the modes build on the Trainer, not the reverse
        return train.train(self, evaluate, actions)

    def distributed_dataset(self, split):
        """Per-replica batches; train starts at the current (restored) step, in
        micro-batches of the input stream, grouped by optimizer step."""
        if split != "train":
            return self.strategy.distribute_datasets_from_function(
                lambda ctx: without_autotune_thread(self.task.build_inputs(split, ctx, 0)))
        start = int(self.step.numpy()) * self.accumulation_steps
        return self.strategy.distribute_datasets_from_function(
            lambda ctx: without_autotune_thread(batch_micro_steps(
                self.task.build_inputs(split, ctx, start), self.accumulation_steps)))

    def restore(self, path=None):
        """Restores checkpoint `path`, or the newest readable one of the workdir; returns
        its path, or None if the workdir has none."""
        path = self.checkpoints.restore(path)
        if path:
            message = self.loss_scale.after_restore(self.policy)
            if message:
                logging.info("%s", message)
        return path

    def restore_or_warm_start(self):
        """Restores the newest checkpoint of the workdir; in a workdir without one, loads
        `config.init` (`warm_start`). Returns the restored path."""
        path = self.restore()
        if path is None:
            self.warm_start()
        return path

    def warm_start(self):
        """Loads `config.init` into the model (fine-tuning, trainer/step/warm_start.py);
        returns what was loaded, or None without `init.checkpoint`."""
        record = warm_start(self.config, self.variable_names, lambda: build_model(self.task),
                            ChiefFiles(self.is_chief), self.workdir, self.task.run_record())
        if record and self.ema:
            self.ema.start_from_weights()
        return record

    def evaluate(self, progress=False):
        """One full pass over the eval split (see `Evaluation.run`), with the EMA weights
        if `eval_weights` says so; returns {metric name: float}."""
        if self._eval_dataset is None:
            self._eval_dataset = self.distributed_dataset("eval")
        with self.eval_weights():
            results = self.evaluation.run(self._eval_dataset, progress)
        logging.info("eval @ step %d%s: %s", int(self.step.numpy()),
                     " (EMA weights)" if self.ema else "", format_metrics(results))
        return results

    def eval_weights(self):
        """A context in which the model holds the weights to evaluate: the EMA ones
        with `optimizer.ema_decay` and `eval.use_ema`, else its own."""
        return self.ema.swapped_in() if self.ema else contextlib.nullcontext()
