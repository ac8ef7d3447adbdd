"""Evaluation: one pass over the eval split, each example exactly once, in one
compiled call (or one call per batch, to draw a progress bar)."""

import keras
import tensorflow as tf


def format_metrics(metrics):
    """`name=value ...` for a log line."""
    return " ".join(f"{k}={v:.4g}" for k, v in metrics.items())


def with_derived_metrics(task, results):
    """`results` ({metric name: float}, with the mean "loss") and, after the loss, the
    metrics the task derives from them (`Task.derived_metrics`)."""
    derived = {name: float(of_results(results))
               for name, of_results in task.derived_metrics().items()}
    at = list(results).index("loss") + 1
    items = list(results.items())
    return dict(items[:at] + list(derived.items()) + items[at:])


def as_float32(outputs):
    """Losses and metrics are computed in float32 whatever the compute dtype."""
    return tf.nest.map_structure(
        lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


class Evaluation:
    """The eval metrics (`loss`, `num_examples`, the task's) and the compiled pass over
    per-replica batches of `model`; build it under `strategy.scope()`."""

    def __init__(self, task, model, strategy):
        self.task, self.model, self.strategy = task, model, strategy
        self.metrics = ([keras.metrics.Mean("loss"), keras.metrics.Sum("num_examples")]
                        + task.build_metrics())
        self._loop = tf.function(self._loop_fn)
        self._batch = tf.function(
            lambda features, labels: strategy.run(self.step, args=(features, labels)))

    @tf.autograph.experimental.do_not_convert  # as train_step (trainer/step/train_step.py)
    def step(self, features, labels):
        """Updates the metrics with one replica's batch (which may be empty)."""
        outputs = as_float32(self.model(features, training=False))
        # Flattened: Keras' Mean would first average each example's per-token losses.
        self.metrics[0].update_state(tf.reshape(self.task.compute_loss(labels, outputs), [-1]))
        examples = tf.shape(tf.nest.flatten(labels)[0])[0]  # labels may be a nest
        self.metrics[1].update_state(tf.cast(examples, tf.float32))
        self.task.update_metrics(self.metrics[2:], labels, outputs)

    def _loop_fn(self, iterator):
        # Over an iterator, not the dataset: a `for` over a dataset in a tf.function
        # runs its body inside tf.data's reduce, which took 1.3-1.5x the time of this
        # `get_next_as_optional` loop for the byte LM's forward pass (as in Keras).
        for features, labels in iterator:
            self.strategy.run(self.step, args=(features, labels))

    def run(self, dataset, progress=False):
        """One pass over `dataset` (distributed); returns {metric name: float}.

        `progress`: a bar of batches on the terminal; the batches then run one
        compiled call each, instead of the whole pass in one.
        """
        for m in self.metrics:
            m.reset_state()
        if progress:
            bar = keras.utils.Progbar(None, unit_name="eval batch")
            batches = 0
            for features, labels in dataset:
                self._batch(features, labels)
                batches += 1
                bar.update(batches)
            bar.update(batches, finalize=True)
        else:
            self._loop(iter(dataset))
        return with_derived_metrics(self.task, {m.name: float(m.result()) for m in self.metrics})

    @property
    def names(self):
        """The names of the metrics `run` returns."""
        return [m.name for m in self.metrics] + list(self.task.derived_metrics())
