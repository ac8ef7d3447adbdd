"""Model shapes users bring, as one Task: `config.model.name` picks the model,
`config.model.variant` changes it (a checkpoint of the original must be refused).

The data are a function of the example index (stateless random images, label
= index mod 4), so a resumed run reads exactly the batches an uninterrupted one
would.
"""

import keras
import ml_collections
import tensorflow as tf

from trainer.task import register
from trainer.task import Task

CLASSES, SIZE = 4, 32


class Counter(keras.layers.Layer):
    """Counts the examples it saw in training (int64) and whether it saw any (bool)."""

    def build(self, input_shape):
        self.count = self.add_weight(shape=(), dtype="int64", initializer="zeros",
                                     trainable=False, name="count")
        self.seen = self.add_weight(shape=(), dtype="bool", initializer="zeros",
                                    trainable=False, name="seen")

    def call(self, x, training=False):
        if training:
            self.count.assign_add(tf.cast(tf.shape(x)[0], tf.int64))
            self.seen.assign(True)
        return x


class BlocksInLists(keras.Model):
    """The Keras tutorials' way: blocks in a Python list, norms in a dict."""

    def __init__(self, depth):
        super().__init__()
        self.blocks = [keras.layers.Dense(16, activation="relu") for _ in range(depth)]
        self.norms = {f"n{i}": keras.layers.BatchNormalization() for i in range(depth)}
        self.head = keras.layers.Dense(CLASSES)

    def call(self, x, training=False):
        x = keras.ops.mean(x, axis=(1, 2))
        for i, block in enumerate(self.blocks):
            x = self.norms[f"n{i}"](block(x), training=training)
        return self.head(x)


class Linear(keras.layers.Layer):
    """The Keras subclassing guide's layer: weights without names."""

    def __init__(self, units):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units),
                                 initializer="random_normal", trainable=True)
        self.b = self.add_weight(shape=(self.units,), initializer="zeros", trainable=True)

    def call(self, inputs):
        return keras.ops.matmul(inputs, self.w) + self.b


class Scale(keras.layers.Layer):
    """A layer whose one weight is named like the layer's auto-name (`scale/scale`)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones",
                                     name="scale")

    def call(self, x):
        return x * self.scale


class Unbuilt(keras.Model):
    """A subclassed model as tutorials write it: no variables until its first call."""

    def __init__(self, variant):
        super().__init__()
        self.conv = keras.layers.Conv2D(8 + variant, 3, activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = Linear(CLASSES)

    def call(self, x, training=False):
        return self.head(self.pool(self.conv(x)))


def _image_input():
    return keras.Input((SIZE, SIZE, 3), name="image")


def _aux_head(variant):
    """Two outputs; the loss uses the first only, so the aux head gets no gradient."""
    image = _image_input()
    h = keras.layers.Dense(16 if variant else 8, activation="relu")(
        keras.layers.GlobalAveragePooling2D()(image))
    return keras.Model(image, [keras.layers.Dense(CLASSES, name="main")(h),
                               keras.layers.Dense(3, name="aux")(h)])


def _counter(variant):
    image = _image_input()
    h = Counter(name="counter")(keras.layers.GlobalAveragePooling2D()(image))
    if variant:
        h = keras.layers.Dense(8)(h)
    return keras.Model(image, keras.layers.Dense(CLASSES)(h))


def _dict_inputs(variant):
    image, meta = _image_input(), keras.Input((5,), name="meta")
    h = keras.layers.Concatenate()([keras.layers.GlobalAveragePooling2D()(image), meta])
    h = keras.layers.Dense(12 if variant else 8, activation="relu")(h)
    return keras.Model({"image": image, "meta": meta}, keras.layers.Dense(CLASSES)(h))


def _frozen_backbone(variant):
    """A conv + BatchNormalization backbone with trainable=False under a trained head."""
    backbone = keras.Sequential([keras.layers.Conv2D(8, 3), keras.layers.BatchNormalization(),
                                 keras.layers.GlobalAveragePooling2D()], name="backbone")
    backbone.trainable = False
    image = _image_input()
    return keras.Model(image, keras.layers.Dense(CLASSES + variant)(backbone(image)))


def _lists(variant):
    model = BlocksInLists(3 if variant else 2)
    model(tf.zeros((1, SIZE, SIZE, 3)))
    return model


def _mobilenet(variant):
    return keras.applications.MobileNetV3Small(
        input_shape=(SIZE, SIZE, 3), weights=None, classes=CLASSES + variant,
        classifier_activation=None, minimalistic=True)


def _unnamed_weights(variant):
    """The guide's Linear (unnamed weights) and Scale (a weight named like its layer)."""
    image = _image_input()
    h = Scale()(keras.layers.GlobalAveragePooling2D()(image))
    h = keras.layers.Activation("relu")(Linear(16 if variant else 8)(h))
    return keras.Model(image, Linear(CLASSES)(h))


def _bidirectional(variant):
    """A wrapper that copies its layer: Bidirectional names the copies after the GRU."""
    image = _image_input()
    rows = keras.layers.Reshape((SIZE, SIZE * 3))(image)
    h = keras.layers.Bidirectional(keras.layers.GRU(12 if variant else 8))(rows)
    return keras.Model(image, keras.layers.Dense(CLASSES)(h))


def _lazy_sequential(variant):
    """A Sequential without an Input: built by Keras on its first call."""
    return keras.Sequential([keras.layers.Conv2D(8, 3, activation="relu"),
                             keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(CLASSES + variant)])


def _synchronized_bn(variant):
    """BatchNormalization with statistics over the global batch (all replicas)."""
    image = _image_input()
    h = keras.layers.Conv2D(8 + variant, 3)(image)
    h = keras.layers.BatchNormalization(synchronized=True)(h)
    h = keras.layers.GlobalAveragePooling2D()(keras.layers.Activation("relu")(h))
    return keras.Model(image, keras.layers.Dense(CLASSES)(h))


MODELS = {"unnamed_weights": _unnamed_weights, "bidirectional": _bidirectional,
          "lazy_sequential": _lazy_sequential, "unbuilt_subclassed": Unbuilt,
          "synchronized_bn": _synchronized_bn,
          "aux_head": _aux_head, "counter": _counter, "dict_inputs": _dict_inputs,
          "frozen_backbone": _frozen_backbone, "lists": _lists, "mobilenet": _mobilenet}


def _main(outputs):
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


@register("zoo")
class Zoo(Task):

    def build_model(self):
        return MODELS[self.config.model.name](int(self.config.model.variant))

    def _features(self, i):
        image = tf.random.stateless_uniform((SIZE, SIZE, 3), tf.stack([i, 1]))
        if self.config.model.name != "dict_inputs":
            return image
        return {"image": image, "meta": tf.random.stateless_uniform((5,), tf.stack([i, 2]))}

    def build_inputs(self, split, input_context, start_step=0):
        batch = input_context.get_per_replica_batch_size(self.config.data.global_batch_size)
        if split == "train":  # one pipeline here: replicas take consecutive batches
            ids = tf.data.Dataset.range(start_step * self.config.data.global_batch_size, 2**40)
        else:
            ids = tf.data.Dataset.range(10**6, 10**6 + 16)
        return ids.map(lambda i: (self._features(i), tf.cast(i % CLASSES, tf.int32))).batch(
            batch, drop_remainder=split == "train")

    def compute_loss(self, labels, outputs):
        return keras.losses.sparse_categorical_crossentropy(labels, _main(outputs),
                                                            from_logits=True)

    def build_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]

    def update_metrics(self, metrics, labels, outputs):
        metrics[0].update_state(labels, _main(outputs))

    def serving_input(self):
        image = tf.TensorSpec([None, SIZE, SIZE, 3], tf.float32, name="image")
        if self.config.model.name == "dict_inputs":  # unnamed: named by their keys
            return {"image": tf.TensorSpec([None, SIZE, SIZE, 3], tf.float32),
                    "meta": tf.TensorSpec([None, 5], tf.float32)}, lambda raw: raw
        return image, lambda raw: raw


def zoo_config(name, **overrides):
    from support import override, tiny_config
    c = tiny_config(**{"task.name": "zoo", "data.global_batch_size": 8,
                       "trainer.train_steps": 4, "trainer.steps_per_loop": 2,
                       "trainer.checkpoint_every": 2, "trainer.eval_every": 0,
                       "trainer.log_every": 0, "trainer.deterministic": True,
                       "trainer.best_metric": ""})
    c.model = ml_collections.ConfigDict(dict(name=name, variant=0))
    return override(c, **overrides)
