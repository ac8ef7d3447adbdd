"""CIFAR-10 from disk in its real formats, or a synthetic stand-in offline.

Reads the standard `cifar-10-batches-py` folder (pickled `data_batch_1..5`
and `test_batch`, any number of images per file) or the
`cifar-10-python.tar.gz` archive that contains it, from any filesystem
`tf.io.gfile` supports (a local path, `gs://...`).

The batches are pickles, and a pickle can name any function to call: they are
decoded by an unpickler that finds only what a CIFAR batch holds (`BatchUnpickler`),
and an archive is read only if its SHA-256 is the published one.
"""

import codecs
import dataclasses
import hashlib
import io
import os
import pickle
import tarfile

import keras
import numpy as np
import tensorflow as tf
from absl import logging

gfile = tf.io.gfile

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
FOLDER = "cifar-10-batches-py"
TARBALL = "cifar-10-python.tar.gz"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
# keras.utils.get_file(fname=KERAS_NAME, extract=True), as keras.datasets.cifar10 calls
# it, extracts the archive into <cache>/KERAS_NAME/ and keeps it as <cache>/KERAS_NAME_archive.
KERAS_NAME = "cifar-10-batches-py-target"
TMP_CACHE = os.path.join("/tmp", ".keras")  # get_file's own fallback
SOURCES = ("auto", "cifar10", "synthetic")


class BatchUnpickler(pickle.Unpickler):
    """Finds only the callables a CIFAR batch pickle needs (numpy arrays; `_codecs.encode`,
    with which Python 3's protocol 2 writes bytes): a pickle that names anything else
    (`os.system` in a `__reduce__`) is refused before it runs."""

    _RECONSTRUCT = np.zeros(0).__reduce__()[0]  # how numpy 1 and 2 unpickle an array
    ALLOWED = {("_codecs", "encode"): codecs.encode, ("numpy", "ndarray"): np.ndarray,
               ("numpy", "dtype"): np.dtype,
               ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,  # (numpy 1 wrote it)
               ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR-10 batch "
                                         "never holds (a pickle that runs code)")
        return self.ALLOWED[(module, name)]


def keras_cache():
    """The datasets folder keras.utils.get_file uses: $KERAS_HOME or ~/.keras, else, when
    that is not writable, /tmp/.keras, but only if this user owns it (any local user
    could have made it first and put batches there). None if there is none."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    if os.access(home, os.W_OK):
        return os.path.join(home, "datasets")
    try:
        owned = os.stat(TMP_CACHE).st_uid == os.getuid()
    except OSError:
        return None
    return os.path.join(TMP_CACHE, "datasets") if owned else None


@dataclasses.dataclass
class Cifar10:
    train_images: np.ndarray  # uint8 [N, 32, 32, 3]
    train_labels: np.ndarray  # int32 [N]
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str               # where the data came from, for logs and summaries
    synthetic: bool = False


def parse_batch(blob, name):
    """Decodes one pickled CIFAR batch; `name` is used in errors."""
    try:
        batch = BatchUnpickler(io.BytesIO(blob), encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int32)
    except Exception as e:  # pickle raises many types on truncated/corrupt input
        raise ValueError(
            f"{name} is not a readable CIFAR-10 batch file ({type(e).__name__}: {e}). "
            "It is truncated or corrupt: delete it and download the dataset again "
            f"from {URL}.") from e
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise ValueError(
            f"{name}: expected 'data' of shape [N, 3072] and N labels, got data "
            f"{data.shape} and {len(labels)} labels. Download the dataset again from {URL}.")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{name}: labels outside 0..9.")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # CHW rows -> NHWC
    return np.ascontiguousarray(images), labels


def _read_files(read, describe):
    """Reads train and test batches with `read(filename) -> bytes`."""
    train = [parse_batch(read(f), describe(f)) for f in TRAIN_FILES]
    test_images, test_labels = parse_batch(read(TEST_FILE), describe(TEST_FILE))
    return (np.concatenate([t[0] for t in train]), np.concatenate([t[1] for t in train]),
            test_images, test_labels)


def read_folder(folder):
    def read(name):
        with gfile.GFile(os.path.join(folder, name), "rb") as f:
            return f.read()
    arrays = _read_files(read, lambda name: os.path.join(folder, name))
    return Cifar10(*arrays, source=f"CIFAR-10 folder {folder}")


def check_archive(path):
    """Refuses an archive other than the published one (its SHA-256)."""
    digest = hashlib.sha256()
    with gfile.GFile(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    if digest.hexdigest() != SHA256:
        raise ValueError(f"{path} is not the published {TARBALL} (its SHA-256 is "
                         f"{digest.hexdigest()}, not {SHA256}): it is damaged or another file. "
                         f"Delete it and download it again from {URL}.")


def read_tarball(path):
    check_archive(path)
    with gfile.GFile(path, "rb") as raw:  # tarfile leaves a given fileobj open
        try:
            archive = tarfile.open(fileobj=raw, mode="r:gz")
            members = {os.path.basename(m.name): m for m in archive.getmembers() if m.isfile()}
        except (tarfile.TarError, EOFError, OSError, tf.errors.OpError) as e:
            raise ValueError(f"{path} is not a readable {TARBALL} ({e}): it is truncated or "
                             f"corrupt. Delete it and download it again from {URL}.") from e

        def read(name):
            if name not in members:
                raise ValueError(f"{path} has no {FOLDER}/{name}: not a CIFAR-10 archive.")
            try:
                return archive.extractfile(members[name]).read()
            except (tarfile.TarError, EOFError, OSError, tf.errors.OpError) as e:
                raise ValueError(f"{path}: cannot read {name} ({e}): the archive is truncated "
                                 f"or corrupt. Download it again from {URL}.") from e

        with archive:
            arrays = _read_files(read, lambda name: f"{path}:{FOLDER}/{name}")
    return Cifar10(*arrays, source=f"CIFAR-10 archive {path}")


def candidate_paths(data_dir):
    """Folders and archives searched, in order: `data_dir`, then Keras' cache."""
    paths = [os.path.join(data_dir, FOLDER), data_dir, os.path.join(data_dir, TARBALL)] \
        if data_dir else []
    cache = keras_cache()
    if cache:
        paths += [os.path.join(cache, KERAS_NAME, FOLDER), os.path.join(cache, FOLDER),
                  os.path.join(cache, f"{KERAS_NAME}_archive"), os.path.join(cache, TARBALL)]
    return paths


def _is_archive(path):
    return path.endswith((TARBALL, "_archive")) and _is_file(path)


def _is_file(path):
    return gfile.exists(path) and not gfile.isdir(path)


def _is_cifar_folder(path):
    return gfile.isdir(path) and all(
        gfile.exists(os.path.join(path, f)) for f in TRAIN_FILES + (TEST_FILE,))


def find_on_disk(data_dir):
    """Returns the loaded dataset, or None; raises if a found file is corrupt."""
    for path in candidate_paths(data_dir):
        if _is_cifar_folder(path):
            return read_folder(path)
        if _is_archive(path):
            return read_tarball(path)
    return None


def download():
    """The Keras download into its cache; None where that fails (offline)."""
    try:
        root = keras.utils.get_file(fname=KERAS_NAME, origin=URL, extract=True,
                                    file_hash=SHA256)
    except Exception as e:  # URLError, HTTPError, hash mismatch...
        logging.warning("Could not download CIFAR-10 from %s: %s", URL, e)
        return None
    return read_folder(os.path.join(root, FOLDER))


def synthetic(num_train=50000, num_test=10000, seed=0):
    """A learnable CIFAR-shaped dataset: each class is a fixed coarse colour pattern
    (4x4 cells of 8x8 pixels, so crops and flips keep it recognisable) plus noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(96, 160, size=(10, 4, 4, 3)).astype(np.float32)
    templates = coarse.repeat(8, axis=1).repeat(8, axis=2)

    def make(n, chunk=1024):
        # Chunk by chunk through one small float buffer: whole-set float32
        # temporaries (0.7 GB each) made this take 15 s instead of 3 s, mostly in
        # first-touch page faults. The draws and the images are the same.
        labels = rng.integers(0, 10, size=n).astype(np.int32)
        images = np.empty((n, 32, 32, 3), np.uint8)
        buffer = np.empty((chunk, 32, 32, 3), np.float32)
        for start in range(0, n, chunk):
            pixels = buffer[:min(chunk, n - start)]
            rng.standard_normal(out=pixels, dtype=np.float32)
            pixels *= 64
            pixels += templates[labels[start:start + len(pixels)]]
            images[start:start + len(pixels)] = np.clip(pixels, 0, 255, out=pixels)
        return images, labels

    train, test = make(num_train), make(num_test)
    return Cifar10(*train, *test, source="SYNTHETIC CIFAR-shaped data (not CIFAR-10)",
                   synthetic=True)


def write_folder(data, folder):
    """Writes `data` as a cifar-10-batches-py folder (5 train batches, 1 test batch)."""
    gfile.makedirs(folder)
    chunks = np.array_split(np.arange(len(data.train_labels)), len(TRAIN_FILES))
    parts = [(name, data.train_images[i], data.train_labels[i])
             for name, i in zip(TRAIN_FILES, chunks)]
    for name, images, labels in parts + [(TEST_FILE, data.test_images, data.test_labels)]:
        rows = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
        with gfile.GFile(os.path.join(folder, name), "wb") as f:
            pickle.dump({b"data": rows, b"labels": labels.tolist(),
                         b"batch_label": name.encode()}, f, protocol=2)


def load(config):
    """`config` is `config.data`: `source` in SOURCES, `data_dir`."""
    if config.source not in SOURCES:
        raise ValueError(f"config.data.source={config.source!r} is unknown; "
                         f"choose one of {SOURCES}.")
    if config.source == "synthetic":
        return synthetic(config.synthetic_train_size, config.synthetic_test_size)
    if config.data_dir and not any(_is_cifar_folder(p) or _is_archive(p)
                                   for p in candidate_paths(config.data_dir)[:3]):
        # An explicit data_dir without the dataset is a mistake, never a reason to
        # fall back to synthetic data.
        listing = sorted(gfile.listdir(config.data_dir))[:10] if gfile.isdir(config.data_dir) \
            else "it does not exist"
        raise FileNotFoundError(
            f"data.data_dir={config.data_dir} holds no CIFAR-10 ({listing}). It must contain "
            f"{FOLDER}/ (with {', '.join(TRAIN_FILES + (TEST_FILE,))}) or {TARBALL}; download "
            f"it from {URL}, or unset --config.data.data_dir.")
    found = find_on_disk(config.data_dir) or download()
    if found is not None:
        return found
    tried = "\n  ".join(candidate_paths(config.data_dir))
    if config.source == "cifar10":
        raise FileNotFoundError(
            f"CIFAR-10 not found (data.source=cifar10). Tried:\n  {tried}\nand the download "
            f"from {URL}. Download {TARBALL} from there and pass its folder with "
            "--config.data.data_dir=DIR (the archive or its extracted "
            f"{FOLDER} folder both work), or use --config.data.source=synthetic.")
    logging.warning(
        "CIFAR-10 not found (tried %s and the download); FALLING BACK TO SYNTHETIC DATA. "
        "Accuracy numbers are not CIFAR-10 numbers. Set --config.data.data_dir to a "
        "folder with %s to train on the real dataset.", ", ".join(candidate_paths(config.data_dir)),
        TARBALL)
    return synthetic(config.synthetic_train_size, config.synthetic_test_size)
