"""For benchmarks/text_classification.py, in a process of its own: Keras' `fit` on the
text task's own model, batches, optimizer and schedule (part `fit`), and a BERT-like
keras_hub preset folder with a WordPiece vocabulary of the training texts (part
`float16`). Prints one JSON line."""

import json
import os
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("train", "", "Training JSONL (text, label).")
flags.DEFINE_string("eval", "", "Eval JSONL.")
flags.DEFINE_integer("steps", 1000, "fit: optimizer steps (as the Trainer's run).")
flags.DEFINE_integer("evals", 4, "fit: evaluations (epochs of steps / evals).")
flags.DEFINE_float("target", 0.6, "fit: the eval accuracy whose time is reported.")
flags.DEFINE_string("workdir", "", "fit: unused; make_bert_preset: the preset folder.")
flags.DEFINE_bool("make_bert_preset", False, "Write the preset instead of fitting.")


def fit():
    import keras
    import tensorflow as tf
    from configs import text
    from trainer.runtime.precision import set_policy
    from trainer.state.layout import variable_names
    from trainer.step.optimizers import build_optimizer
    from trainer.task import get_task

    config = text.get_config()
    config.data.update(format="jsonl", train=FLAGS.train, eval=FLAGS.eval)
    config.precision = "float32"
    set_policy("float32", tf.distribute.get_strategy())
    keras.utils.set_random_seed(config.seed)
    task = get_task(config)
    context = tf.distribute.InputContext()
    train, held = task.build_inputs("train", context), task.build_inputs("eval", context)
    model = task.build_model()
    optimizer = build_optimizer(config.optimizer, FLAGS.steps,
                                trained=variable_names(model))
    optimizer.global_clipnorm = config.optimizer.clip_norm  # one device: the Trainer's clip
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.train_seconds, self.curve = 0.0, []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.monotonic()

        def on_test_begin(self, logs=None):  # fit's eval closes the epoch's training
            self.train_seconds += time.monotonic() - self.start

        def on_epoch_end(self, epoch, logs=None):
            self.curve.append((round(self.train_seconds, 1), round(logs["val_accuracy"], 4)))

    clock = Clock()
    model.fit(train, steps_per_epoch=FLAGS.steps // FLAGS.evals, epochs=FLAGS.evals,
              validation_data=held, callbacks=[clock], verbose=0)
    examples = FLAGS.steps // FLAGS.evals * FLAGS.evals * config.data.global_batch_size
    reached = next((s for s, a in clock.curve if a >= FLAGS.target), None)
    return {"examples_per_sec": round(examples / clock.train_seconds, 1),
            "train_seconds": round(clock.train_seconds, 1), "accuracy": clock.curve[-1][1],
            "seconds_to_target": reached, "eval_curve": clock.curve}


def make_bert_preset():
    import keras_hub
    with open(FLAGS.train) as f:
        texts = [json.loads(line)["text"] for line in f]
    import tensorflow as tf
    vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
        tf.data.Dataset.from_tensor_slices(texts).batch(1024),  # (a list: file names)
        vocabulary_size=8000, lowercase=True,
        reserved_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(vocabulary), num_layers=2, num_heads=2, hidden_dim=64,
        intermediate_dim=256, max_sequence_length=64)  # small: float16 is emulated on CPUs
    os.makedirs(FLAGS.workdir, exist_ok=True)
    backbone.save_to_preset(FLAGS.workdir)
    tokenizer.save_to_preset(FLAGS.workdir)
    return {"preset": FLAGS.workdir, "vocabulary": len(vocabulary)}


def main(argv):
    del argv
    print(json.dumps(make_bert_preset() if FLAGS.make_bert_preset else fit()), flush=True)


if __name__ == "__main__":
    app.run(main)
