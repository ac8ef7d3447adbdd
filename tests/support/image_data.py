"""Tiny real image sets for the file-format tests: scikit-learn's digits (8x8 grayscale,
shipped in its wheel) written as a PNG class folder, as TFRecord shards and as a TFDS
dataset prepared offline; and files_config, configs/images.py shrunk to read them."""


import numpy as np

from benchmarks.image_files import write_folder, write_tfrecords  # noqa: F401
from configs import images
from support import override


def digits(n=None):
    """(uint8 images [N, 8, 8, 1], int64 labels [N]) of the digits set, first n."""
    from sklearn.datasets import load_digits
    d = load_digits()
    images = np.round(d.images * (255 / 16)).astype(np.uint8)[..., None]
    return images[:n], d.target[:n].astype(np.int64)


def prepare_tfds(data_dir, images, labels, file_format="array_record"):
    """A TFDS dataset `tiny_digits_<file_format>` (train: all but the last 100 examples,
    test: those 100), prepared from the arrays without a download; returns its name."""
    import tensorflow_datasets as tfds
    name = f"tiny_digits_{file_format}"

    class TinyDigits(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")
        # Where TFDS would look for the builder's checksums.tsv: there is none. (Left to
        # find it, TFDS 4.9 imports importlib_resources, a backport for Python < 3.9 it
        # does not install, when the builder's module is in a package, as this one is.)
        code_path = None

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 1)),
                "label": tfds.features.ClassLabel(num_classes=10)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(slice(0, -100)),
                    "test": self._generate_examples(slice(-100, None))}

        def _generate_examples(self, part):
            for i, (x, y) in enumerate(zip(images[part], labels[part])):
                yield i, {"image": x, "label": int(y)}

    TinyDigits.name = name
    TinyDigits(data_dir=str(data_dir), file_format=file_format).download_and_prepare(
        download_config=tfds.download.DownloadConfig(verify_ssl=False))
    return name


def files_config(data, **overrides):
    """configs/images.py shrunk: 8px digits, the seed CNN, 20 steps of 32."""
    c = images.get_config()
    c.data.update(image_size=8, global_batch_size=32, augment=False,
                  normalization="unit_range", **data)
    c.model.name = "seed_cnn"
    c.precision = "float32"
    c.distribution.strategy = "default"
    c.optimizer.update(name="adam", learning_rate=1e-3, schedule="constant", warmup_steps=0)
    c.trainer.update(train_steps=20, steps_per_loop=5, log_every=5, eval_every=10,
                     checkpoint_every=10, per_step_summaries=False, jit_compile="off")
    return override(c, **overrides)
