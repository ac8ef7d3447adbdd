"""The Task contract: everything model-specific the Trainer needs, and the registry
that maps `config.task.name` to a Task class. A task of your own imports only this
module (and the data layer, `trainer.data`), never the built-in `tasks` package."""

import abc
import importlib

import keras
import tensorflow as tf

from trainer.runtime.plugins import import_module

_REGISTRY = {}
BUILT_IN = "tasks"  # the package whose modules register the shipped tasks


def register(name):
    """Class decorator adding a Task under `name`."""
    def add(cls):
        if name in _REGISTRY:
            raise ValueError(f"Task {name!r} is registered twice.")
        _REGISTRY[name] = cls
        return cls
    return add


def get_task(config):
    """Builds the task named by `config.task.name`, importing `config.task.module` first
    (a Task of the user's own registers itself on import) and the built-in tasks."""
    importlib.import_module(BUILT_IN)
    if config.task.module:
        import_module(config.task.module, "config.task.module")
    name = config.task.name
    if name not in _REGISTRY:
        raise ValueError(f"Unknown task {name!r} (config.task.name). Known tasks: "
                         f"{', '.join(sorted(_REGISTRY))}. A task of your own: set "
                         "config.task.module to the module that registers it.")
    return _REGISTRY[name](config)


class Task(abc.ABC):
    """A model, its data and its loss. Subclass it and `@register` it.

    The Trainer calls these under `strategy.scope()` (build_model,
    build_metrics) and per input pipeline (build_inputs); it never looks
    inside `features`, `labels` or `outputs`.
    """

    tokens_per_example = None  # set it (e.g. seq_len) to get tokens/sec in logs

    def __init__(self, config):
        self.config = config

    @abc.abstractmethod
    def build_model(self):
        """Returns a built `keras.Model`, outputs cast to float32 where they feed a loss."""

    @abc.abstractmethod
    def build_inputs(self, split, input_context, start_step=0):
        """Returns a `tf.data.Dataset` of per-replica batches `(features, labels)`.

        `split` is "train" (repeated forever, fixed batch size) or "eval"
        (one pass, every example exactly once, last batch may be smaller).
        `start_step` is how many global batches training has already read (the
        step it resumes at, times `trainer.accumulation_steps`): a task whose train
        order is a function of it (as images and lm are) resumes exactly.
        Shard by `input_context.input_pipeline_id` and batch with
        `input_context.get_per_replica_batch_size(global_batch_size)`.
        """

    @abc.abstractmethod
    def compute_loss(self, labels, outputs):
        """Returns float32 losses, one per example [batch] or per token [batch, ...].

        Training minimizes their mean over the global batch (trailing axes
        averaged first); evaluation reports the mean over every element.
        """

    @abc.abstractmethod
    def build_metrics(self):
        """Returns a list of `keras.metrics.Metric` (a `loss` mean is added by the Trainer)."""

    @abc.abstractmethod
    def update_metrics(self, metrics, labels, outputs):
        """Updates `metrics` (as built by `build_metrics`) with one batch."""

    def derived_metrics(self):
        """{name: function of the results ({metric name: float}, with the mean `loss`)}
        for metrics computed from the others (perplexity from the loss, bits per byte
        from the loss and a count of bytes): reported after the loss, in training and
        evaluation, without a second pass over the outputs."""
        return {}

    def serving_input(self):
        """(tf.TensorSpec of the raw input a client sends, function from it to the model's
        features) for `--mode=export`, e.g. uint8 images and the normalization."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define serving_input(), so it cannot be "
            "exported; see docs/export.md#the-signature.")

    def serving_endpoints(self, model):
        """{name: (tf.function, [tf.TensorSpec])}: endpoints the SavedModel serves beside
        `serving_default` (a language model's `generate`, text in and text out)."""
        return {}

    def serving_settings(self):
        """{name: JSON-able} the serving functions fix when exported (a tokenizer, how
        `generate` samples): written in the export's metadata, so an export of the same
        step with other settings is not taken for the one already there."""
        return {}

    def serving_resources(self):
        """TensorFlow resources the serving functions use besides the model's variables
        (a tokenizer's model, a lookup table): the SavedModel keeps them."""
        return []

    def prepare_data(self):
        """Makes the data ready to read, once for many runs (a language model's token
        shards), and returns a line saying what is ready; `--mode=prepare` calls it, and
        so does training before it builds anything (where it must be cheap when the data
        is ready). The default has nothing to prepare."""
        return None

    def flops_per_example(self):
        """FLOPs of one example's forward and backward pass, for MFU (trainer/step/flops.py);
        None (the default): counted on the model's forward graph."""
        return None

    def serving_outputs(self, outputs):
        """{name: tensor} that `--mode=export` serves (floats as float32) from the model's
        outputs: `logits` and `probabilities` (softmax) of a single output; each tensor
        of a nest of outputs under its key or index path (`aux`, `output_1`, ...)."""
        if tf.is_tensor(outputs):
            return {"logits": outputs, "probabilities": tf.nn.softmax(
                tf.cast(outputs, tf.float32))}
        return {"_".join(str(k) if isinstance(k, str) else f"output_{k}" for k in path): t
                for path, t in keras.tree.flatten_with_path(outputs)}

    def display_images(self, features):
        """A train batch's `features` as images in [0, 1] ([N, H, W, C]) for TensorBoard,
        or None (not an image task)."""
        return None

    def eval_tables(self, metrics):
        """{name: markdown} for TensorBoard's text tab after each evaluation, read from
        the task's eval metrics (as `build_metrics` made them) after the pass: a
        classifier's confusion matrix. The default: none."""
        return {}

    def run_record(self):
        """JSON the run keeps of its data in `workdir/task.json` (a classifier's label
        names): written when the run starts; a resume that would read it otherwise (the
        labels changed, so an id would mean another class) is refused. None: nothing."""
        return None

    def eval_sample(self, model):
        """A short text the model generates, written to TensorBoard at each evaluation,
        or None."""
        return None

    def generate(self, model, prompt=None):
        """The text `model` generates from `prompt` (a str; None: the task's configured
        prompt), for `--mode=sample`. Tokenizing and sampling are the task's."""
        raise NotImplementedError(f"{type(self).__name__} does not generate text "
                                  "(--mode=sample is for language models).")

    def input_remedy(self):
        """What to change when the log says the run is input-bound (waiting on data)."""
        return ("more parallel work in build_inputs (map with num_parallel_calls=AUTOTUNE), "
                "cache() what does not change between epochs, or the tf.data service "
                "(docs/data.md#the-tfdata-service)")

    def explain_input_error(self, error):
        """An exception that says which input broke the run (a file, a record), for an
        error raised while reading it (`error`), or None: the error as it is."""
        return None

    def describe_data(self):
        """One line saying where the data came from, for logs and the final summary."""
        return "unknown"

    def data_paths(self):
        """The local folders and globs the task reads: a training run refuses a workdir
        they reach (its own files would become data, and change between launches)."""
        return ()
