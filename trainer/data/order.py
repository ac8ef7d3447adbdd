"""Train batches as a pure function of the step: what makes a resume exact."""

import tensorflow as tf


def step_indexed_batches(num_examples, batch_size, input_context, start_step, seed,
                         make_batch):
    """A dataset of this input pipeline's per-replica train batches, from `start_step`.

    Replica batch g holds examples g*batch_size ... of an endless stream in which
    every epoch is a fresh stateless permutation of the `num_examples` indices
    (`index_shuffle` seeded by `seed` and the epoch). `make_batch(indices, g)` turns
    the int64 example indices of replica batch g into the batch (g also seeds
    augmentation). A resumed run starts at the batch of `start_step` (the global
    batches already read) and sees exactly what an uninterrupted run would: no
    iterator state to checkpoint, and the examples do not depend on how the
    stream is cut into batches or across replicas.
    """
    return step_indexed_indices(num_examples, batch_size, input_context, start_step,
                                seed).map(make_batch, num_parallel_calls=tf.data.AUTOTUNE)


def step_indexed_indices(num_examples, batch_size, input_context, start_step, seed):
    """(indices [batch_size] int64, g) of this pipeline's replica batches from
    `start_step`: the order `step_indexed_batches` reads, for pipelines that read their
    examples from files (tasks/image_classification.py)."""
    if batch_size > num_examples:
        raise ValueError(f"A replica batch of {batch_size} is more than the "
                         f"{num_examples} training examples.")
    pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
    replicas_per_pipeline = input_context.num_replicas_in_sync // pipelines
    seed = tf.constant(seed, tf.int64)

    def shuffled(index, epoch):
        return tf.random.experimental.index_shuffle(index, tf.stack([seed, epoch]),
                                                    num_examples - 1)

    def batch(k):
        g = k * pipelines + pipeline  # this replica batch's place in the global stream
        idx = g * batch_size + tf.range(batch_size, dtype=tf.int64)
        epoch, pos = idx // num_examples, idx % num_examples
        first = epoch[0]  # a batch spans at most two epochs (batch_size <= num_examples)
        return tf.where(epoch == first, shuffled(pos, first), shuffled(pos, first + 1)), g

    start = start_step * replicas_per_pipeline
    return tf.data.Dataset.range(start, 2**62).map(batch, num_parallel_calls=tf.data.AUTOTUNE)
