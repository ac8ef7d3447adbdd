"""Language-model examples from token shards: windows of seq_len + 1 tokens over the
packed documents (trainer/data/token_shards.py), read by index.

Training window i starts at token i * seq_len, and the step-indexed order
(trainer/data/order.py) says which windows each step reads: a resume is exact and the
examples of a step do not depend on the number of workers or replicas. Evaluation reads
a fixed set of windows spread evenly over the held-out split, the same every time.
"""

import numpy as np
import tensorflow as tf

from trainer.data.order import step_indexed_batches


def count(split, seq_len):
    """How many whole windows of seq_len + 1 tokens the split holds (consecutive ones
    share one token)."""
    return max((len(split.tokens) - 1) // seq_len, 0)


def _reader(split, seq_len, rows=None):
    """int64 window indices -> int32 [rows, seq_len + 1], read from the memory map. A
    NumPy function, which tf.data runs on its own threads (a window is a few hundred
    bytes: the GIL is held briefly)."""
    def windows(indices):
        out = tf.numpy_function(lambda i: split.windows(i * seq_len, seq_len + 1),
                                [indices], tf.int32, stateful=False)
        return tf.ensure_shape(out, [rows, seq_len + 1])
    return windows


def train_windows(split, seq_len, batch_size, input_context, start_step, seed):
    """This pipeline's replica batches of training windows, from `start_step`."""
    available = count(split, seq_len)
    if batch_size > available:
        raise ValueError(
            f"The training split has {available} windows of seq_len+1={seq_len + 1} "
            f"tokens, fewer than a replica's batch of {batch_size}: use more text "
            "(data.train) or a smaller data.global_batch_size or model.seq_len.")
    read = _reader(split, seq_len, batch_size)
    return step_indexed_batches(available, batch_size, input_context, start_step, seed,
                                lambda indices, g: read(indices))


def eval_indices(split, seq_len, max_windows):
    """The evaluated windows: `max_windows` (0: all) spread evenly over the split."""
    available = count(split, seq_len)
    if not available:
        raise ValueError(f"The eval split holds {len(split.tokens)} tokens, less than one "
                         f"window of seq_len+1={seq_len + 1}: give it more text (data.eval, "
                         "data.eval_fraction).")
    n = min(max_windows, available) if max_windows else available
    return np.arange(n, dtype=np.int64) * available // n


def eval_windows(split, seq_len, max_windows, batch_size, input_context):
    """Every evaluated window once, over this pipeline's share (the last batch smaller)."""
    ds = tf.data.Dataset.from_tensor_slices(eval_indices(split, seq_len, max_windows))
    if input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

    return ds.batch(batch_size).map(_reader(split, seq_len))
