"""The Trainer: compiled train/eval steps, loops, checkpoints and summaries."""

import json
import os
import signal
import threading
import time

import keras
import tensorflow as tf
from absl import logging

from trainer.checkpoints import Checkpoints
from trainer.distribute import is_chief
from trainer.loss_scale import LossScale, all_finite
from trainer.optimizers import build_optimizer, disable_keras_all_reduce
from trainer.workdir import is_local


def _as_float32(outputs):
    """Losses and metrics are computed in float32 whatever the compute dtype."""
    return tf.nest.map_structure(
        lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


def _step_variable(name):
    """An int64 counter that every replica sees alike and only cross-replica code moves."""
    return tf.Variable(0, dtype=tf.int64, name=name, trainable=False,
                       synchronization=tf.VariableSynchronization.ON_WRITE,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


SEED_STATE_NAME = "seed_generator_state"  # what keras.random.SeedGenerator names its state


def _format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Trainer:
    """Trains and evaluates `task` under `strategy` as `config.trainer` says.

    Build the strategy and set the Keras precision policy first (see
    launch.py); the model, optimizer, loss scale and metrics are created here,
    under `strategy.scope()`.
    """

    def __init__(self, config, task, strategy, workdir):
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
        if self.train_steps <= 0:
            raise ValueError(f"trainer.train_steps must be > 0, got {self.train_steps}.")
        check_intervals(config.trainer)
        self.clip_norm = config.optimizer.clip_norm
        if config.trainer.deterministic:
            # With the step-derived input order of the tasks, this makes a resumed
            # run bitwise equal to an uninterrupted one (on CPU; slower kernels).
            tf.config.experimental.enable_op_determinism()
        self.policy = keras.mixed_precision.global_policy().name

        with strategy.scope():
            self.model = task.build_model()
            self.step = _step_variable("global_step")
            self.optimizer = disable_keras_all_reduce(
                build_optimizer(config.optimizer, self.train_steps, self.step))
            # Slots are created lazily; build them now so a restore fills them.
            self.optimizer.build(self.model.trainable_variables)
            self.loss_scale = LossScale(
                enabled=self.policy == "mixed_float16",
                dynamic=config.loss_scale.dynamic,
                initial_scale=config.loss_scale.initial_scale,
                growth_steps=config.loss_scale.growth_steps)
            self.nonfinite_streak = _step_variable("nonfinite_streak")  # not checkpointed
            self.train_metrics = [keras.metrics.Mean("loss")] + task.build_metrics()
            self.grad_norm = keras.metrics.Mean("grad_norm")
            self.eval_metrics = ([keras.metrics.Mean("loss"), keras.metrics.Sum("num_examples")]
                                 + task.build_metrics())

        # Keras' dropout draws from SeedGenerator variables; the Trainer sets them at
        # each step from (seed, step, replica), see `_reseed`. The non-trainable
        # float variables are state the forward pass updates (BN statistics).
        self.seed_states = [v for v in self.model.non_trainable_variables
                            if v.path.endswith(SEED_STATE_NAME)]
        self.state_variables = [v for v in self.model.non_trainable_variables
                                if tf.as_dtype(v.dtype).is_floating]
        self.max_nonfinite_steps = int(config.trainer.max_nonfinite_steps or (
            100 if self.loss_scale.enabled else 1))
        self.is_chief = is_chief(strategy)
        self._multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        self.checkpoints = Checkpoints(
            tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                loss_scale=self.loss_scale, step=self.step),
            os.path.join(workdir, "checkpoints"), self.step, config.trainer.max_to_keep,
            self.is_chief)
        self._compute_gradients = tf.function(
            self._forward_backward, jit_compile=bool(config.trainer.jit_compile))
        self.train_loop = tf.function(self._train_loop_fn)
        self.eval_loop = tf.function(self._eval_loop_fn)
        self._writers = {}
        self._eval_dataset = None  # built on the first evaluation, reused after

    # ----------------------------------------------------------------- steps

    def _forward_backward(self, features, labels):
        """Forward and backward pass on one replica's batch (XLA with jit_compile)."""
        with tf.GradientTape() as tape:
            outputs = _as_float32(self.model(features, training=True))
            per_example_loss = self.task.compute_loss(labels, outputs)
            if per_example_loss.shape.rank > 1:  # per-token losses: average each example's
                per_example_loss = tf.reduce_mean(
                    per_example_loss, axis=list(range(1, per_example_loss.shape.rank)))
            # Average over the *global* batch: the all-reduce SUM makes it the mean.
            loss = tf.nn.compute_average_loss(per_example_loss,
                                              global_batch_size=self.global_batch_size)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(
                    tf.add_n([tf.cast(l, tf.float32) for l in self.model.losses]))
            scaled_loss = self.loss_scale.get_scaled_loss(loss)
        grads = tape.gradient(scaled_loss, self.model.trainable_variables)
        return outputs, loss, grads

    def train_step(self, features, labels):
        """One training step on one replica (run under `strategy.run`)."""
        replica = tf.distribute.get_replica_context()
        self._reseed(replica.replica_id_in_sync_group)
        state_before = [tf.identity(v.value) for v in self.state_variables]
        outputs, loss, scaled_grads = self._compute_gradients(features, labels)
        # Sparse gradients (embedding lookups) become dense: all_reduce would
        # concatenate IndexedSlices instead of summing them, and the global norm
        # of a concatenation with duplicate indices is not the norm of the sum.
        scaled_grads = [tf.convert_to_tensor(g) for g in scaled_grads]
        # The step's one gradient all-reduce.
        scaled_grads = replica.all_reduce(tf.distribute.ReduceOp.SUM, scaled_grads)
        # The state the forward pass updated on each replica from its own examples
        # (BN statistics) is averaged, so every replica keeps the same values.
        state_mean = replica.all_reduce(
            tf.distribute.ReduceOp.MEAN, [tf.identity(v.value) for v in self.state_variables]
        ) if self.state_variables else []
        # After the all-reduce every replica holds the same values, so the
        # finiteness decision below is the same everywhere.
        grads = self.loss_scale.get_unscaled_gradients(scaled_grads)
        finite = all_finite(grads)
        for v, before, mean in zip(self.state_variables, state_before, state_mean):
            v.assign(tf.where(finite, mean, before))  # a skipped step changes no state
        grad_norm = tf.linalg.global_norm(grads)
        if self.clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=grad_norm)
        replica.merge_call(self._apply_if_finite, args=(grads, finite))

        # `loss` is this replica's share of the global mean: the Mean over replicas of
        # share * replicas is the global mean.
        self.train_metrics[0].update_state(
            loss * tf.cast(replica.num_replicas_in_sync, tf.float32))
        self.task.update_metrics(self.train_metrics[1:], labels, outputs)
        # A skipped step has weight 0; its norm (inf or NaN) is replaced, as inf*0 is NaN.
        self.grad_norm.update_state(tf.where(finite, grad_norm, 0.0),
                                    sample_weight=tf.cast(finite, tf.float32))

    def _reseed(self, replica_id):
        """Sets every dropout SeedGenerator from (config.seed, step, replica).

        Random masks are then a function of the step, like the input order: a
        resumed run draws exactly what an uninterrupted one would (no RNG state
        to checkpoint), and replicas draw distinct masks.
        """
        for i, state in enumerate(self.seed_states):
            seed = tf.constant([self.config.seed, i], tf.int64)
            seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(replica_id, tf.int64))
            seed = tf.random.experimental.stateless_fold_in(seed, self.step.read_value())
            state.assign(tf.cast(seed, state.dtype))

    def _apply_if_finite(self, strategy, grads, finite):
        """Cross-replica: apply the reduced gradients on every replica, or skip the step.

        A `tf.cond` around `optimizer.apply` inside the replica function fails
        (its sync points cannot sit in control flow), so the decision is
        taken here and the apply is dispatched back to the replicas.
        """
        finite = tf.reduce_all(strategy.experimental_local_results(finite))

        def apply():
            strategy.extended.call_for_each_replica(
                lambda g: self.optimizer.apply(g, self.model.trainable_variables),
                args=(grads,))
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))
        self.loss_scale.update(finite)
        self.step.assign_add(1)
        self.nonfinite_streak.assign(
            tf.where(finite, tf.constant(0, tf.int64), self.nonfinite_streak + 1))

    def _train_loop_fn(self, iterator, num_steps):
        """`num_steps` train steps in one compiled call (a graph while-loop); stops
        early once `max_nonfinite_steps` steps in a row were non-finite."""
        for _ in tf.range(num_steps):
            if self.nonfinite_streak >= self.max_nonfinite_steps:
                break
            features, labels = next(iterator)
            self.strategy.run(self.train_step, args=(features, labels))

    def eval_step(self, features, labels):
        """Updates the eval metrics with one replica's batch (which may be empty)."""
        outputs = _as_float32(self.model(features, training=False))
        # Flattened: Keras' Mean would first average each example's per-token losses.
        self.eval_metrics[0].update_state(tf.reshape(self.task.compute_loss(labels, outputs), [-1]))
        self.eval_metrics[1].update_state(tf.cast(tf.shape(labels)[0], tf.float32))
        self.task.update_metrics(self.eval_metrics[2:], labels, outputs)

    def _eval_loop_fn(self, dataset):
        for features, labels in dataset:
            self.strategy.run(self.eval_step, args=(features, labels))

    # ----------------------------------------------------------------- loops

    def distributed_dataset(self, split):
        """Per-replica batches; train starts at the current (restored) step."""
        start_step = int(self.step.numpy()) if split == "train" else 0
        return self.strategy.distribute_datasets_from_function(
            lambda ctx: self.task.build_inputs(split, ctx, start_step))

    def restore(self):
        """Restores the newest readable checkpoint of the workdir; returns its path or None."""
        path = self.checkpoints.restore()
        if path:
            message = self.loss_scale.after_restore(self.policy)
            if message:
                logging.info("%s", message)
        return path

    def evaluate(self):
        """One full pass over the eval split; returns {metric name: float}."""
        for m in self.eval_metrics:
            m.reset_state()
        if self._eval_dataset is None:
            self._eval_dataset = self.distributed_dataset("eval")
        self.eval_loop(self._eval_dataset)
        results = {m.name: float(m.result()) for m in self.eval_metrics}
        step = int(self.step.numpy())
        logging.info("eval @ step %d: %s", step, _format_metrics(results))
        self._write_scalars("eval", results)
        return results

    def train(self, evaluate=True):
        """Trains to `trainer.train_steps` from wherever the workdir left off.

        SIGTERM/SIGINT: the current host loop (at most `steps_per_loop` steps)
        finishes, a checkpoint is written and `Preempted` is raised.
        """
        self.restore()
        start_step, t_start = int(self.step.numpy()), time.time()
        iterator = iter(self.distributed_dataset("train"))  # bad data fails before any write
        self._write_start()
        if start_step >= self.train_steps:
            logging.info("Already trained to step %d >= train_steps=%d: nothing to train.",
                         start_step, self.train_steps)
        with _StopOnSignal() as stop:
            try:
                eval_results = self._host_loop(iterator, evaluate, stop)
            except tf.errors.OpError as e:
                if not self._multi_worker:
                    raise
                raise RuntimeError(
                    f"A peer worker failed or became unreachable near step "
                    f"{int(self.step.numpy())} ({type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0][:200]}). Relaunch every worker with the "
                    "same --workdir: training resumes from "
                    f"{self.checkpoints.latest}.") from e
        if evaluate and eval_results is None:
            eval_results = self.evaluate()
        self._flush()
        self._log_final(start_step, time.time() - t_start, eval_results)
        return eval_results

    def _host_loop(self, iterator, evaluate, stop):
        """Compiled chunks of steps; logs, checkpoints and evals at their boundaries."""
        tc = self.config.trainer
        intervals = [tc.steps_per_loop, tc.log_every, tc.checkpoint_every,
                     tc.eval_every if evaluate else 0]
        boundaries = [b for b in intervals if b > 0]
        step = step_log = int(self.step.numpy())
        eval_results, train_seconds = None, 0.0  # seconds since the last log, eval excluded
        while step < self.train_steps:
            num_steps = min([b - step % b for b in boundaries] + [self.train_steps - step])
            t0 = time.time()
            self.train_loop(iterator, tf.constant(num_steps, tf.int64))
            step = int(self.step.numpy())  # waits for the loop to finish
            train_seconds += time.time() - t0
            self._check_finite(step)
            done = step >= self.train_steps
            if done or _every(step, tc.log_every):
                self._log_train(step, step - step_log, train_seconds)
                train_seconds, step_log = 0.0, step
            stopping = self._any_worker(stop.signum is not None)
            if done or stopping or _every(step, tc.checkpoint_every):
                self.save()
            if stopping:
                self._flush()
                raise Preempted(f"Stopped by {stop.name} at step {step}; checkpoint saved in "
                                f"{self.checkpoints.directory}. Relaunch with the same --workdir to "
                                "continue from this step.", stop.signum or signal.SIGTERM)
            if evaluate and (done or _every(step, tc.eval_every)):
                eval_results = self.evaluate()
        return eval_results

    def save(self):
        """Writes a checkpoint at the current step (all workers must call it)."""
        self.checkpoints.save()

    def _any_worker(self, flag):
        """True on every worker if `flag` is True on any (keeps workers in lockstep)."""
        if not self._multi_worker:
            return flag
        return bool(self._sum_over_replicas(tf.constant(int(flag))))

    @tf.function
    def _sum_over_replicas(self, value):
        per_replica = self.strategy.run(tf.identity, args=(value,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _check_finite(self, step):
        """Stops the run, before anything is saved, if it has diverged."""
        streak = int(self.nonfinite_streak.numpy())
        weights_finite = bool(all_finite(self.model.weights))
        if streak < self.max_nonfinite_steps and weights_finite:
            return
        latest = self.checkpoints.latest if self.is_chief else None
        what = (f"{streak} consecutive steps had non-finite gradients (skipped, so the "
                "weights were not changed by them)" if weights_finite
                else "the weights became non-finite")
        raise FloatingPointError(
            f"Training diverged at step {step}: {what}. Mean train loss since the last log: "
            f"{float(self.train_metrics[0].result()):.4g}; loss scale "
            f"{float(self.loss_scale.scale.numpy()):g}. No checkpoint was written; the last "
            f"good one is kept: {latest or 'none yet'}. Try a lower "
            "--config.optimizer.learning_rate, --config.optimizer.clip_norm=1.0, float32 "
            "or mixed_bfloat16 instead of mixed_float16, or a larger "
            f"--config.trainer.max_nonfinite_steps (now {self.max_nonfinite_steps}).")

    # --------------------------------------------------------------- reports

    def _writer(self, name):
        if name not in self._writers:
            self._writers[name] = (
                tf.summary.create_file_writer(os.path.join(self.workdir, name)) if self.is_chief
                else tf.summary.create_noop_writer())
        return self._writers[name]

    def _write_scalars(self, writer, scalars):
        with self._writer(writer).as_default(step=self.step.read_value()):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        self._writer(writer).flush()

    def _flush(self):
        for w in self._writers.values():
            w.flush()

    def _log_train(self, step, num_steps, elapsed):
        metrics = {m.name: float(m.result()) for m in self.train_metrics}
        steps_per_sec = num_steps / max(elapsed, 1e-9)
        eta = (self.train_steps - step) / max(steps_per_sec, 1e-9)
        scalars = dict(metrics,
                       learning_rate=float(tf.convert_to_tensor(self.optimizer.learning_rate)),
                       loss_scale=float(self.loss_scale.scale.numpy()),
                       grad_norm=float(self.grad_norm.result()),
                       skipped_steps=float(self.loss_scale.skipped_steps.numpy()),
                       steps_per_sec=steps_per_sec,
                       examples_per_sec=steps_per_sec * self.global_batch_size)
        if self.task.tokens_per_example:
            scalars["tokens_per_sec"] = scalars["examples_per_sec"] * self.task.tokens_per_example
        self._write_scalars("train", scalars)
        tokens = (f", {scalars['tokens_per_sec']:.0f} tokens/s"
                  if "tokens_per_sec" in scalars else "")
        logging.info("step %d/%d: %s | %.0f ex/s%s, %.2f steps/s, ETA %s", step,
                     self.train_steps, _format_metrics(metrics), scalars["examples_per_sec"],
                     tokens, steps_per_sec, _format_duration(eta))
        for m in self.train_metrics + [self.grad_norm]:
            m.reset_state()

    def _write_start(self):
        if self.is_chief:
            tf.io.gfile.makedirs(self.workdir)
            with tf.io.gfile.GFile(os.path.join(self.workdir, "config.json"), "w") as f:
                f.write(self.config.to_json_best_effort(indent=2))
        with self._writer("train").as_default(step=self.step.read_value()):
            tf.summary.text("config", "```\n" + str(self.config) + "\n```")
        parent = os.path.dirname(os.path.abspath(self.workdir) if is_local(self.workdir)
                                 else self.workdir.rstrip("/"))
        logging.info("TensorBoard logs in %s; view with: tensorboard --logdir=%s",
                     self.workdir, parent)

    def _log_final(self, start_step, seconds, eval_results):
        source = self.task.describe_data()
        summary = {
            "steps": int(self.step.numpy()), "steps_this_run": int(self.step.numpy()) - start_step,
            "seconds": round(seconds, 1), "precision": self.policy,
            "skipped_steps": int(self.loss_scale.skipped_steps.numpy()),
            "data": source, "eval": eval_results,
        }
        logging.info("Done: %s", json.dumps(summary))
        if "SYNTHETIC" in source:
            logging.warning("This run used SYNTHETIC data, not the real dataset.")


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint; `signum` says which."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum


class _StopOnSignal:
    """Records SIGTERM/SIGINT instead of dying mid-step (main thread only).

    Our own flag rather than tf.distribute's PreemptionCheckpointHandler, which
    only serves MultiWorkerMirroredStrategy and TPUStrategy; `_any_worker`
    shares the flag between workers.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum, self.previous = None, {}

    @property
    def name(self):
        return signal.Signals(self.signum).name if self.signum else "a signal to another worker"

    def _record(self, signum, frame):
        self.signum = signum
        logging.warning("Received %s: finishing the current loop, then saving a checkpoint.",
                        self.name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._record) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def _every(step, interval):
    """True at multiples of `interval`; an interval of 0 never fires (the end of
    training still logs, checkpoints and evaluates)."""
    return interval > 0 and step % interval == 0


def check_intervals(trainer_config):
    """Interval fields are whole numbers of steps: steps_per_loop >= 1, the others >= 0."""
    for name in ("steps_per_loop", "log_every", "checkpoint_every", "eval_every"):
        value, minimum = trainer_config[name], 1 if name == "steps_per_loop" else 0
        if not isinstance(value, int) or value < minimum:
            raise ValueError(
                f"trainer.{name}={value!r} must be an integer >= {minimum}"
                + (" (0: only at the end of training)." if minimum == 0 else "."))


def _format_metrics(metrics):
    return " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
