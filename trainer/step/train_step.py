"""The compiled train step and loop: everything of training that runs inside
`tf.function`, in the order it runs.

`train_step` (forward and backward on each micro-batch, loss scaling, the one
gradient all-reduce, skip or apply), then the compiled loop of `steps_per_loop`
steps. `Trainer` (trainer/step/trainer.py) builds what these methods use: the
model, optimizer, loss scale, step variables and metrics. Evaluation is
trainer/step/evaluation.py; the host loop around both trainer/loop/controller.py.
"""

import contextlib

import tensorflow as tf

from trainer.runtime.distribute import sum_over_replicas
from trainer.step.accumulation import accumulate
from trainer.step.evaluation import as_float32
from trainer.step.loss_scale import all_finite


class TrainStep:
    """The step's methods, a base of `Trainer`, which sets the state they read."""

    # With trainer.per_step_summaries, what `train_loop` returns for every step.
    PER_STEP_SCALARS = ("loss", "learning_rate", "loss_scale", "grad_norm")

    def _forward_backward(self, features, labels, record_activations):
        """Forward and backward pass on one replica's micro-batch (XLA with jit_compile)."""
        capture = (self.telemetry.activations.capture() if self.telemetry
                   else contextlib.nullcontext())
        self.example_spec = tf.nest.map_structure(  # for the model FLOPs (trainer/step/flops.py)
            lambda t: tf.TensorSpec([1, *t.shape[1:]], t.dtype), features)
        with tf.GradientTape() as tape:
            with capture as layer_outputs:
                outputs = as_float32(self.model(features, training=True))
            loss = self.step_loss(labels, outputs)
            scaled_loss = self.loss_scale.get_scaled_loss(loss)
        grads = tape.gradient(scaled_loss, self.trained_variables)
        self.variables.note_gradients(grads)
        # Sparse gradients (embedding lookups) become dense float32: all_reduce would
        # concatenate IndexedSlices instead of summing them, and the global norm of a
        # concatenation with duplicate indices is not the norm of the sum. A missing
        # one is zeros here, and left out of the all-reduce and the update (`train_step`).
        grads = [tf.zeros(v.shape) if g is None else tf.cast(tf.convert_to_tensor(g), tf.float32)
                 for g, v in zip(grads, self.trained_variables)]
        activations = (self.telemetry.activations.statistics(layer_outputs, record_activations)
                       if self.telemetry else tf.zeros([0, 3]))
        return outputs, loss, grads, activations

    def step_loss(self, labels, outputs):
        """This replica's share of the optimizer step's loss from one micro-batch."""
        per_example_loss = self.task.compute_loss(labels, outputs)
        if per_example_loss.shape.rank > 1:  # per-token losses: average each example's
            per_example_loss = tf.reduce_mean(
                per_example_loss, axis=list(range(1, per_example_loss.shape.rank)))
        # Average over the examples of the whole optimizer step (every replica, every
        # micro-batch): the sums of the accumulation and of the all-reduce make the mean.
        loss = tf.nn.compute_average_loss(
            per_example_loss, global_batch_size=self.examples_per_step)
        if self.model.losses:  # counted once per optimizer step
            loss += tf.nn.scale_regularization_loss(tf.add_n(
                [tf.cast(l, tf.float32) for l in self.model.losses])) / self.accumulation_steps
        return loss

    def _micro_batch(self, features, labels, micro_step, record):
        """One micro-batch on this replica: its loss share, local scaled gradients and
        activation statistics; updates the train metrics (but the loss)."""
        self._reseed(self.step * self.accumulation_steps + tf.cast(micro_step, tf.int64))
        outputs, loss, grads, activations = self._compute_gradients(features, labels, record)
        self.task.update_metrics(self.train_metrics[1:], labels, outputs)
        return loss, grads, activations

    # Not converted by AutoGraph (its loops and branches on tensors are tf.while_loop and
    # tf.cond already), nor are the Task's methods and the model it calls, as in Keras'
    # own train step: converting this call tree took 1.5 s of the first chunk's trace.
    @tf.autograph.experimental.do_not_convert
    def train_step(self, features, labels):
        """One optimizer step on one replica (run under `strategy.run`); returns the
        step's global loss and gradient norm, the same on every replica."""
        replica = tf.distribute.get_replica_context()
        state_before = self.variables.snapshot()
        record = self.telemetry.due(self.step + 1) if self.telemetry else tf.constant(False)
        if self.accumulation_steps == 1:
            loss, scaled_grads, activations = self._micro_batch(features, labels, 0, record)
        else:  # features are [accumulation_steps, micro-batch, ...]: no all-reduce in there
            zeros = (tf.zeros([]), [tf.zeros(v.shape) for v in self.trained_variables],
                     tf.zeros([self.telemetry.activations.rows if self.telemetry else 0, 3]))
            loss, scaled_grads, activations = accumulate(
                self._micro_batch, features, labels, self.accumulation_steps, record, zeros)
        # Variables the loss does not reach (an unused head, a branch not taken) have no
        # gradient: they stay out of the all-reduce, the norm and the update.
        scaled_grads = self.variables.with_gradient(scaled_grads)
        # The step's one all-reduce: the gradients, and the loss along with them.
        scaled_grads, loss = sum_over_replicas(replica, scaled_grads, loss,
                                               self.all_reduce_dtype)
        # The state the forward pass updated on each replica is made the same on all.
        state_after = self.variables.synchronized(replica)
        # After the all-reduce every replica holds the same values, so the
        # finiteness decision below is the same everywhere.
        grads = self.loss_scale.get_unscaled_gradients(scaled_grads)
        finite = all_finite(grads)
        self.variables.keep_if(finite, state_after, state_before)  # skipped: no change
        unclipped = grads  # what telemetry reports
        grad_norm = tf.linalg.global_norm(grads)
        if self.clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=grad_norm)
        replica.merge_call(self._apply_if_finite, args=(
            grads, finite,
            (self.variables.with_missing(unclipped), self.variables.with_missing(scaled_grads),
             activations[tf.newaxis]) if self.telemetry else None))

        # The Mean over replicas of the (equal) global loss is the global loss.
        self.train_metrics[0].update_state(loss)
        # A skipped step has weight 0; its norm (inf or NaN) is replaced, as inf*0 is NaN.
        self.grad_norm.update_state(tf.where(finite, grad_norm, 0.0),
                                    sample_weight=tf.cast(finite, tf.float32))
        return loss, grad_norm

    def _reseed(self, micro_batch):
        """Sets every dropout SeedGenerator from (config.seed, micro-batch, replica).

        Random masks are then a function of the micro-batch's place in the input
        stream, like its examples: a resumed run draws exactly what an
        uninterrupted one would (no RNG state to checkpoint), and replicas and
        micro-batches draw distinct masks.
        """
        replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
        for i, state in enumerate(self.variables.seeds):
            seed = tf.constant([self.config.seed, i], tf.int64)
            seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(replica_id, tf.int64))
            seed = tf.random.experimental.stateless_fold_in(seed, micro_batch)
            state.assign(tf.cast(seed, state.dtype))

    def _apply_if_finite(self, strategy, grads, finite, telemetry_args):
        """Cross-replica: apply the reduced gradients on every replica, or skip the step.

        A `tf.cond` around `optimizer.apply` inside the replica function fails
        (its sync points cannot sit in control flow), so the decision is
        taken here and the apply is dispatched back to the replicas.
        """
        finite = tf.reduce_all(strategy.experimental_local_results(finite))

        updated = self.variables.updated

        def apply():
            strategy.extended.call_for_each_replica(
                lambda g: self.optimizer.apply(g, updated), args=(grads,))
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))
        if self.telemetry:  # numerics.every > 0; else nothing of it is traced
            def first_replica(values):  # identical on every replica after the all-reduce
                return [strategy.experimental_local_results(v)[0] for v in values]
            unclipped, scaled, activations = telemetry_args
            self.telemetry.record(self.step + 1, first_replica(unclipped),
                                  first_replica(scaled), finite,
                                  strategy.gather(activations, axis=0))  # [replicas, ...]
        self.loss_scale.update(finite)
        self.step.assign_add(1)
        self.nonfinite_streak.assign(
            tf.where(finite, tf.constant(0, tf.int64), self.nonfinite_streak + 1))

    def _train_loop_fn(self, iterator, num_steps):
        """`num_steps` train steps in one compiled call (a graph while-loop); stops
        early once `max_nonfinite_steps` steps in a row were non-finite.

        Returns {"input_wait": seconds spent waiting for the next batch (0 under op
        determinism, which refuses a clock)} and, with
        `trainer.per_step_summaries`, "per_step": [steps run, 4], each step's
        `PER_STEP_SCALARS` (for `Summaries.per_step`).
        """
        records = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        input_wait = tf.constant(0.0, tf.float64)
        for i in tf.range(num_steps):
            if self.nonfinite_streak >= self.max_nonfinite_steps:
                break
            if not self.times_input:
                features, labels = next(iterator)
            else:  # the host clock: how long the input pipeline keeps the step waiting
                asked = tf.timestamp()
                with tf.control_dependencies([asked]):
                    features, labels = next(iterator)
                with tf.control_dependencies(tf.nest.flatten((features, labels),
                                                             expand_composites=True)):
                    input_wait += tf.timestamp() - asked
            learning_rate = tf.cast(self.optimizer.learning_rate, tf.float32)  # this step's
            loss_scale = tf.identity(self.loss_scale.scale)
            loss, grad_norm = self.strategy.run(self.train_step, args=(features, labels))
            if self.per_step_summaries:
                first = self.strategy.experimental_local_results  # equal on every replica
                records = records.write(tf.cast(i, tf.int32), tf.stack(
                    [first(loss)[0], learning_rate, loss_scale, first(grad_norm)[0]]))
        if self.per_step_summaries:
            return {"input_wait": input_wait, "per_step": records.stack()}
        return {"input_wait": input_wait}

    # ------------------------------------------------ XLA or not, chosen by the host

    def use_jit(self, xla):
        """Compiles the forward and backward pass with XLA or not (before a trace of the
        train loop, or the loop is traced again). Without XLA the pass is traced into
        the step itself: a layer that all-reduces in its forward pass (synchronized
        BatchNormalization) cannot do so inside a nested tf.function."""
        self.jit_compile = xla
        self._compute_gradients = self.forward_backward(xla)
        self.train_loop = tf.function(self._train_loop_fn)

    def forward_backward(self, xla):
        """The forward and backward pass, compiled by XLA or to be traced into its caller."""
        return tf.function(self._forward_backward, jit_compile=True, autograph=False) if xla \
            else self._forward_backward
