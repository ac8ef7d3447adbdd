"""The loader reads the real CIFAR-10 formats: files written here, read back exactly."""

import hashlib
import os
import pickle
import tarfile

import numpy as np
import pytest
import tensorflow as tf

from support import tiny_config
from trainer.task import get_task
from trainer.data.images import cifar10 as cifar10_data


def write_cifar(root, rng, sizes=(7, 5, 3, 4, 6), test_size=9):
    """Writes cifar-10-batches-py/ as the original pickles; returns the arrays written."""
    folder = root / cifar10_data.FOLDER
    folder.mkdir(parents=True)
    written = {}
    names = list(cifar10_data.TRAIN_FILES) + [cifar10_data.TEST_FILE]
    for name, n in zip(names, list(sizes) + [test_size]):
        images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).tolist()
        rows = images.transpose(0, 3, 1, 2).reshape(n, 3072)  # R plane, G plane, B plane
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": rows,
                 b"filenames": [f"{i}.png".encode() for i in range(n)]}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        written[name] = (images, np.array(labels))
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [b"airplane"] * 10, b"num_vis": 3072}, f, protocol=2)
    return folder, written


def assert_matches(data, written):
    train = [written[n] for n in cifar10_data.TRAIN_FILES]
    np.testing.assert_array_equal(data.train_images, np.concatenate([t[0] for t in train]))
    np.testing.assert_array_equal(data.train_labels, np.concatenate([t[1] for t in train]))
    np.testing.assert_array_equal(data.test_images, written["test_batch"][0])
    np.testing.assert_array_equal(data.test_labels, written["test_batch"][1])


def test_reads_folder_image_for_image(tmp_path):
    folder, written = write_cifar(tmp_path, np.random.default_rng(0))
    config = tiny_config(**{"data.source": "cifar10", "data.data_dir": str(tmp_path)})
    data = cifar10_data.load(config.data)
    assert_matches(data, written)
    assert not data.synthetic and str(folder) in data.source


def write_archive(folder, archive, monkeypatch):
    """`folder` as a cifar-10-python.tar.gz at `archive`, taken for the published one."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=cifar10_data.FOLDER)
    monkeypatch.setattr(cifar10_data, "SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())


def test_reads_tarball_image_for_image(tmp_path, monkeypatch):
    folder, written = write_cifar(tmp_path / "src", np.random.default_rng(1))
    archive = tmp_path / "dl" / cifar10_data.TARBALL
    write_archive(folder, archive, monkeypatch)
    config = tiny_config(**{"data.source": "cifar10", "data.data_dir": str(archive.parent)})
    assert_matches(cifar10_data.load(config.data), written)


def test_an_archive_that_is_not_the_published_one_is_refused(tmp_path, monkeypatch):
    folder, _ = write_cifar(tmp_path / "src", np.random.default_rng(1))
    archive = tmp_path / "dl" / cifar10_data.TARBALL
    write_archive(folder, archive, monkeypatch)
    monkeypatch.setattr(cifar10_data, "SHA256", "0" * 64)
    config = tiny_config(**{"data.source": "cifar10", "data.data_dir": str(archive.parent)})
    with pytest.raises(ValueError, match=r"is not the published cifar-10-python.tar.gz \(its "
                                         r"SHA-256 is [0-9a-f]{64}, not 0+\)"):
        cifar10_data.load(config.data)


class RunsACommand:
    """What a hostile batch file holds: unpickling it runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_batch_file_that_would_run_code_is_refused_before_it_runs(tmp_path):
    folder, _ = write_cifar(tmp_path, np.random.default_rng(2))
    path, marker = folder / "data_batch_2", tmp_path / "ran"
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    batch[b"extra"] = RunsACommand(marker)
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)
    config = tiny_config(**{"data.source": "cifar10", "data.data_dir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"data_batch_2 is not a readable CIFAR-10 batch .*"
                                         r"names posix.system"):
        cifar10_data.load(config.data)
    assert not marker.exists()


def test_a_download_into_keras_home_is_found(tmp_path, monkeypatch):
    # Where keras.utils.get_file(fname=KERAS_NAME, extract=True) leaves it under KERAS_HOME.
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cifar10_data, "download", lambda: None)
    _, written = write_cifar(tmp_path / "home" / "datasets" / cifar10_data.KERAS_NAME,
                             np.random.default_rng(4))
    data = cifar10_data.load(tiny_config(**{"data.source": "auto", "data.data_dir": ""}).data)
    assert not data.synthetic
    assert_matches(data, written)


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_a_tmp_keras_cache_of_another_user_is_never_read(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "not_writable"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # (root may write anywhere)
    monkeypatch.setattr(cifar10_data, "TMP_CACHE", str(tmp_path / "tmp_keras"))
    write_cifar(tmp_path / "tmp_keras" / "datasets", np.random.default_rng(5))
    os.chown(tmp_path / "tmp_keras", 4242, 4242)  # made first by another local user
    assert cifar10_data.keras_cache() is None
    os.chown(tmp_path / "tmp_keras", os.getuid(), os.getgid())  # get_file's own, made by us
    assert cifar10_data.keras_cache() == str(tmp_path / "tmp_keras" / "datasets")


def test_corrupt_batch_file_names_the_file(tmp_path):
    folder, _ = write_cifar(tmp_path, np.random.default_rng(2))
    path = folder / "data_batch_3"
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])  # truncated
    config = tiny_config(**{"data.source": "cifar10", "data.data_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="data_batch_3.*truncated or corrupt"):
        cifar10_data.load(config.data)


def test_truncated_tarball_names_the_archive(tmp_path):
    folder, _ = write_cifar(tmp_path / "src", np.random.default_rng(3))
    archive = tmp_path / cifar10_data.TARBALL
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=cifar10_data.FOLDER)
    archive.write_bytes(archive.read_bytes()[:2000])
    config = tiny_config(**{"data.source": "cifar10", "data.data_dir": str(tmp_path)})
    with pytest.raises(ValueError, match=str(archive)):
        cifar10_data.load(config.data)


@pytest.fixture
def offline_empty_home(tmp_path, monkeypatch):
    """No Keras cache, and the download fails as it does offline."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(cifar10_data, "download", lambda: None)
    return tmp_path


def test_missing_data_with_source_cifar10_is_an_error(offline_empty_home):
    config = tiny_config(**{"data.source": "cifar10", "data.data_dir": ""})
    with pytest.raises(FileNotFoundError) as e:
        cifar10_data.load(config.data)
    message = str(e.value)
    assert str(offline_empty_home / "cache") in message and "--config.data.data_dir" in message
    assert "source=synthetic" in message


@pytest.mark.parametrize("source", ["auto", "cifar10"])
def test_data_dir_with_other_files_is_an_error_not_a_fallback(offline_empty_home, source):
    other = offline_empty_home / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not cifar")
    config = tiny_config(**{"data.source": source, "data.data_dir": str(other)})
    with pytest.raises(FileNotFoundError, match=r"holds no CIFAR-10 \(\['notes.txt'\]\)"):
        cifar10_data.load(config.data)


def test_auto_falls_back_to_synthetic_loudly(offline_empty_home, caplog):
    config = tiny_config(**{"data.source": "auto", "data.data_dir": ""})
    data = cifar10_data.load(config.data)
    assert data.synthetic and "SYNTHETIC" in data.source
    assert data.train_images.shape == (config.data.synthetic_train_size, 32, 32, 3)
    assert any("SYNTHETIC" in r.getMessage() for r in caplog.records)


def assert_pad4_crops_or_mirrors(images, out):
    padded = np.pad(images, [(0, 0), (4, 4), (4, 4), (0, 0)])
    moved = 0
    for i in range(len(images)):
        windows = [(dy, dx, f) for dy in range(9) for dx in range(9) for f in (False, True)
                   if np.array_equal(out[i], (lambda w: w[:, ::-1] if f else w)(
                       padded[i, dy:dy + 32, dx:dx + 32]))]
        assert windows, f"image {i} is not a pad-4 crop (or its mirror) of the input"
        moved += windows[0][:2] != (4, 4) or windows[0][2]
    assert moved > len(images) // 2  # augmentation really moves most images


def test_random_crop_and_flip_copies_whole_pixel_windows():
    import tensorflow as tf
    from trainer.data.images.preprocess import random_crop_and_flip
    images = np.random.default_rng(4).integers(0, 256, size=(16, 32, 32, 3), dtype=np.uint8)
    out = random_crop_and_flip(tf.constant(images), tf.constant([0, 1], tf.int64)).numpy()
    assert out.dtype == np.uint8
    assert_pad4_crops_or_mirrors(images, out)


def test_fused_augmentation_crops_flips_and_normalizes():
    """The XLA-compiled version draws its own random numbers, so it is checked by property."""
    import tensorflow as tf
    from trainer.data.images.preprocess import MEAN, STD, augment_and_normalize
    images = np.random.default_rng(5).integers(0, 256, (16, 32, 32, 3), np.uint8)
    seed = tf.constant([3, 4], tf.int64)
    out = augment_and_normalize(tf.constant(images), seed, "standardize").numpy()
    np.testing.assert_array_equal(
        out, augment_and_normalize(tf.constant(images), seed, "standardize").numpy())
    pixels = np.rint(out * np.array(STD) + np.array(MEAN)).astype(np.uint8)
    assert_pad4_crops_or_mirrors(images, pixels)


def copy_to(local, remote):
    """Copies a local tree to another filesystem (ram://) with tf.io.gfile."""
    gfile = tf.io.gfile
    for root, _, files in os.walk(local):
        relative = os.path.relpath(root, local)
        target = remote if relative == "." else remote + "/" + relative.replace(os.sep, "/")
        gfile.makedirs(target)
        for f in files:
            gfile.copy(os.path.join(root, f), target + "/" + f, overwrite=True)


@pytest.mark.parametrize("layout", ["folder", "tarball"])
def test_reads_the_real_format_from_a_remote_filesystem(tmp_path, layout, monkeypatch):
    """ram:// is TensorFlow's in-memory filesystem: what works there works on gs://."""
    folder, written = write_cifar(tmp_path / "src", np.random.default_rng(5))
    if layout == "tarball":
        write_archive(folder, tmp_path / "up" / cifar10_data.TARBALL, monkeypatch)
    else:
        (tmp_path / "up").mkdir()
        copy_to(str(tmp_path / "src"), str(tmp_path / "up"))
    remote = f"ram://cifar_{layout}"
    copy_to(str(tmp_path / "up"), remote)
    config = tiny_config(**{"data.source": "cifar10", "data.data_dir": remote})
    data = cifar10_data.load(config.data)
    assert_matches(data, written)
    assert remote in data.source


def test_a_model_or_an_export_reads_no_data(tmp_path):
    """CIFAR-10's class count and image size are fixed: building the model (as an export
    does) loads nothing, so a run exports after its data is gone."""
    task = get_task(tiny_config(**{"data.source": "cifar10",
                                   "data.data_dir": str(tmp_path / "gone")}))
    assert task.build_model().outputs[0].shape[-1] == 10
    with pytest.raises(FileNotFoundError, match="holds no CIFAR-10"):
        task.describe_data()  # reading it is what needs the data
