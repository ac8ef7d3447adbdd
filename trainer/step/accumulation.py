"""Gradient accumulation inside one replica's optimizer step.

With `trainer.accumulation_steps = k`, each optimizer step reads one element of
k micro-batches per replica (`batch_micro_steps`) and `accumulate` runs the
forward and backward pass on them one after the other, summing the local
gradients in float32. Nothing crosses replicas in there: the step's single
all-reduce, finiteness decision, clipping and update come after, once per
optimizer step, exactly as without accumulation. The sums live only inside
the step, so a checkpoint never falls in the middle of a cycle and a resume
needs no accumulator state.

Keras 3's `gradient_accumulation_steps` is not used: it fails with a
`merge_call` error under any tf.distribute strategy, and it would accumulate
gradients already all-reduced (one all-reduce per micro-batch).
"""

import tensorflow as tf
from absl import logging


def check_accumulation_steps(value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"trainer.accumulation_steps={value!r} must be an integer >= 1 "
                         "(1: no accumulation).")
    return value


def warn_if_the_stream_moves(previous_config, config, step):
    """Warns when a resumed run reads global batches of another size or number per step
    than the run that wrote the workdir: the stream resumes at `step * k` batches of
    the new size, which is not where the old run stopped (examples skipped or read
    twice); nothing records the old position in examples."""
    if not previous_config or not step:
        return None
    def per_step(c):
        return (c.get("data", {}).get("global_batch_size"),
                c.get("trainer", {}).get("accumulation_steps", 1))
    old, new = per_step(previous_config), per_step(config.to_dict())
    if old == new:
        return None
    message = (f"Resuming at step {step} with data.global_batch_size, "
               f"trainer.accumulation_steps = {new}, but the workdir was trained with {old}: "
               f"the input stream restarts at global batch {step * new[1]} of size {new[0]}, "
               "not where that run stopped, so some examples are skipped or read twice.")
    logging.warning("%s", message)
    return message


def batch_micro_steps(dataset, accumulation_steps):
    """Groups a per-replica train dataset's batches by optimizer step: [k, batch, ...]."""
    if accumulation_steps == 1:
        return dataset
    return dataset.batch(accumulation_steps, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def accumulate(micro_batch_fn, features, labels, accumulation_steps, record, zeros):
    """Sums `micro_batch_fn(features[i], labels[i], i, record)` -> (loss, gradients,
    statistics) over the micro-batches i, starting from `zeros` (of that structure),
    in a graph loop: the graph holds one forward and backward pass, whatever k.
    `record` is passed on for micro-batch 0 only, whose statistics (zeros on the
    others) the sum then returns.
    """
    def body(i, sums):
        micro_features, micro_labels = tf.nest.map_structure(lambda t: t[i], (features, labels))
        values = micro_batch_fn(micro_features, micro_labels, i,
                                tf.logical_and(record, tf.equal(i, 0)))
        return i + 1, tf.nest.map_structure(tf.add, sums, values)

    # parallel_iterations=1: one micro-batch's activations in memory at a time.
    _, sums = tf.while_loop(lambda i, _: i < accumulation_steps, body,
                            (tf.constant(0), zeros), parallel_iterations=1)
    return sums
