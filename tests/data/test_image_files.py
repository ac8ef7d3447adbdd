"""configs/images.py: class folders, TFRecord shards and TFDS read in the step-indexed
order (exact resume, shares per input pipeline, any topology), and bad input named."""

import hashlib
import io
import struct
import zlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from trainer.task import get_task
from trainer.data.images import decode as image_decode, splits as image_splits
from trainer import assemble
from support import ROOT, build, image_data, kill_relaunch_and_compare, override
from support.image_data import files_config

FORMATS = ("folder", "tfrecord", "tfds_array_record", "tfds_tfrecord")
pytestmark = pytest.mark.xdist_group("image_files")  # one test process writes the files


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    """{format: data config fields} of the digits (1697 train, 100 eval) in every format."""
    root = tmp_path_factory.mktemp("digits")
    x, y = image_data.digits()
    train, test = slice(0, -100), slice(-100, None)
    out = {
        "folder": dict(format="folder",
                       train=image_data.write_folder(root / "train", x[train], y[train]),
                       eval=image_data.write_folder(root / "eval", x[test], y[test])),
        "tfrecord": dict(format="tfrecord", num_classes=10,
                         train=image_data.write_tfrecords(root / "rec" / "train", x[train],
                                                          y[train]),
                         eval=image_data.write_tfrecords(root / "rec" / "eval", x[test],
                                                         y[test], shards=1))}
    for file_format in ("array_record", "tfrecord"):
        name = image_data.prepare_tfds(root / file_format, x, y, file_format)
        out[f"tfds_{file_format}"] = dict(format="tfds", tfds_name=name, train="train",
                                          eval="test", tfds_data_dir=str(root / file_format))
    return out


def fingerprints(images):
    """One hash per image: examples compared across batches, pipelines and formats."""
    return [hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest()[:12] for x in images]


def examples(features, labels):
    """Sorted (pixel hash, label) of unit_range features of the 1-channel digits."""
    pixels = np.round(np.asarray(features) * 255).astype(np.uint8)
    np.testing.assert_array_equal(pixels[..., 0], pixels[..., 2])  # gray -> 3 channels
    return sorted(zip(fingerprints(pixels[..., :1]), np.asarray(labels).tolist()))


def digits_examples(part):
    x, y = image_data.digits()
    return sorted(zip(fingerprints(x[part]), y[part].tolist()))


def context(pipelines=1, pipeline=0, replicas=1):
    return tf.distribute.InputContext(pipelines, pipeline, replicas)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_the_same_pixels_and_labels(digits_files, fmt):
    task = get_task(files_config(digits_files[fmt]))
    assert task.data.num_classes == 10
    batches = list(task.build_inputs("eval", context()).as_numpy_iterator())
    x = np.concatenate([b[0] for b in batches])
    assert x.shape == (100, 8, 8, 3)
    assert examples(x, np.concatenate([b[1] for b in batches])) == digits_examples(
        slice(-100, None))


@pytest.mark.parametrize("fmt", FORMATS)
def test_train_stream_resumes_at_the_step_and_splits_across_pipelines(digits_files, fmt):
    """Two pipelines (1 replica each) read, step by step, what one pipeline with 2
    replicas reads; from start_step=k the stream is the tail of the one from 0; an
    epoch holds every example once."""
    task = get_task(files_config(digits_files[fmt]))
    one = list(task.build_inputs("train", context(1, 0, 2)).take(2 * 60).as_numpy_iterator())
    parts = [list(task.build_inputs("train", context(2, p, 2)).take(60).as_numpy_iterator())
             for p in range(2)]
    for k in range(60):  # step k: replica batches 2k, 2k+1
        for r in range(2):
            np.testing.assert_array_equal(one[2 * k + r][0], parts[r][k][0])
            np.testing.assert_array_equal(one[2 * k + r][1], parts[r][k][1])
    resumed = list(task.build_inputs("train", context(1, 0, 2), 7).take(4).as_numpy_iterator())
    for a, b in zip(one[14:], resumed):
        np.testing.assert_array_equal(a[0], b[0])
    first_epoch = [np.concatenate([b[i] for b in one])[:1697] for i in range(2)]
    assert examples(*first_epoch) == digits_examples(slice(0, -100))


def encode(array, fmt):
    """An image file's bytes in `fmt` (PIL: GIF and BMP, which TensorFlow cannot write)."""
    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(array.squeeze()).save(out, format=fmt)
    return out.getvalue()


def test_odd_folders_ignore_what_is_not_an_image_and_read_every_image_kind(tmp_path, caplog):
    rng = np.random.default_rng(0)
    files = {"gray/a.png": tf.io.encode_png(rng.integers(0, 255, (5, 7, 1), np.uint8)),
             "rgba/b.PNG": tf.io.encode_png(rng.integers(0, 255, (9, 9, 4), np.uint8)),
             "rgb/c.jpg": tf.io.encode_jpeg(rng.integers(0, 255, (12, 6, 3), np.uint8)),
             "rgb/d.gif": encode(rng.integers(0, 255, (4, 4), np.uint8), "GIF"),
             "rgb/e.bmp": encode(rng.integers(0, 255, (6, 3, 3), np.uint8), "BMP"),
             "rgb/nested/f.png": tf.io.encode_png(rng.integers(0, 255, (3, 3, 3), np.uint8)),
             "rgb/.DS_Store": b"\0\1", "rgb/README.txt": b"notes", "notes.txt": b"x"}
    for split in ("train", "eval"):
        for name, data in files.items():
            path = tmp_path / split / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data.numpy() if tf.is_tensor(data) else data)
    (tmp_path / "train" / "empty").mkdir()
    caplog.set_level("WARNING")
    task = get_task(files_config(dict(format="folder", train=str(tmp_path / "train"),
                                            eval=str(tmp_path / "eval")),
                                       **{"data.global_batch_size": 6}))
    assert task.data.num_classes == 3
    assert task.data.source("train").class_names == ("gray", "rgb", "rgba")
    log = caplog.text
    assert "3 file(s) that are not images" in log and "rgb/.DS_Store" in log
    assert "without images are ignored: empty" in log
    x, y = next(iter(task.build_inputs("train", context())))
    assert x.shape == (6, 8, 8, 3) and sorted(y.numpy()) == [0, 1, 1, 1, 1, 2]


def folder_with(tmp_path, bad):
    """The first 60 digits as a class folder, plus `bad` {name in class digit_1: bytes}."""
    x, y = image_data.digits(60)
    root = image_data.write_folder(tmp_path / "train", x, y)
    for name, data in bad.items():
        (tmp_path / "train" / "digit_1" / name).write_bytes(data)
    return dict(format="folder", train=root, eval=root)


BAD = {"truncated.png": lambda good: good[:len(good) // 2],
       "empty.png": lambda good: b"",
       "text.jpg": lambda good: b"this is no image"}


def test_an_unreadable_image_stops_the_run_naming_the_file(tmp_path):
    good = open(image_data.write_folder(tmp_path / "one", *image_data.digits(1))
                + "/digit_0/00000.png", "rb").read()
    data = folder_with(tmp_path, {"text.jpg": BAD["text.jpg"](good)})
    task = get_task(files_config(data, **{"data.global_batch_size": 61}))
    with pytest.raises(tf.errors.InvalidArgumentError) as e:  # named as it is read
        next(iter(task.build_inputs("train", context())))
    assert "digit_1/text.jpg" in str(e.value) and "data.skip_bad=True" in str(e.value)

    data = folder_with(tmp_path / "b", {"truncated.png": BAD["truncated.png"](good)})
    config = files_config(data, **{"data.global_batch_size": 61})
    with pytest.raises(ValueError, match=r"1 image file\(s\) cannot be decoded \(not an "
                       r"image, truncated or corrupt\): \S+/digit_1/truncated.png\. Remove "
                       r"or fix them, or set --config.data.skip_bad=True"):  # explained
        assemble.run(config, tf.distribute.get_strategy(), str(tmp_path / "run"), "train")


def test_skip_bad_leaves_out_the_same_files_on_every_launch(tmp_path, caplog):
    good = open(image_data.write_folder(tmp_path / "one", *image_data.digits(1))
                + "/digit_0/00000.png", "rb").read()
    bad = {name: make(good) for name, make in BAD.items()}
    flipped = bytearray(good)  # whole framing, corrupt data: only the decoder can tell
    flipped[len(good) // 2] ^= 0xFF
    bad["flipped.png"] = bytes(flipped)
    data = folder_with(tmp_path, bad)
    caplog.set_level("WARNING")
    config = files_config(data, **{"data.skip_bad": True, "data.global_batch_size": 8})
    first = get_task(config)
    second = image_splits.ImageSplits(config.data)  # another launch's
    assert len(first.data.kept("train")) == 60 == len(second.kept("train"))
    assert first.data.skipped["train"] == sorted(
        os.path.join(data["train"], "digit_1", n) for n in bad)
    assert "leaving out 4 unreadable train file(s)" in caplog.text
    assert "flipped.png" in caplog.text
    assert "(60 train examples, 4 unreadable file(s) skipped)" in first.describe_data()
    a = list(first.build_inputs("train", context(), 3).take(8).as_numpy_iterator())
    image_splits._OPENED.clear()  # a new process
    b = list(get_task(config).build_inputs("train", context(), 3).take(
        8).as_numpy_iterator())
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def png_declaring(width, height):
    """A grayscale PNG of about 100 bytes whose header declares width x height."""
    return (image_decode._HEADS[0] + image_decode._png_chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + image_decode._png_chunk(b"IDAT", zlib.compress(b"\0" * 4096))
        + image_decode._png_chunk(b"IEND", b""))


def test_the_pixels_an_image_declares_are_read_from_its_header():
    rng = np.random.default_rng(0)
    files = [tf.io.encode_png(rng.integers(0, 255, (5, 7, 1), np.uint8)).numpy(),
             tf.io.encode_jpeg(rng.integers(0, 255, (12, 6, 3), np.uint8)).numpy(),
             encode(rng.integers(0, 255, (4, 9), np.uint8), "GIF"),
             encode(rng.integers(0, 255, (6, 3, 3), np.uint8), "BMP"),
             png_declaring(100_000, 100_000), b"no image", b"",
             struct.pack("<2sIHHIIii", b"BM", 0, 0, 0, 54, 40, 6, -3),  # top-down rows
             png_declaring(2**32 - 1, 2**32 - 1)]  # (the product would pass int64)
    pixels = image_decode.declared_pixels(tf.constant(files)).numpy().tolist()
    assert pixels == [35, 72, 36, 18, 10**10, 0, 0, 18, 2**62]


def test_an_image_declaring_too_many_pixels_is_named_and_never_decoded(tmp_path, caplog):
    # 10^10 pixels in about 100 bytes: decoding it would need 10 GB, 40 GB to resize.
    data = folder_with(tmp_path, {"huge.png": png_declaring(100_000, 100_000)})
    task = get_task(files_config(data, **{"data.global_batch_size": 61}))
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        next(iter(task.build_inputs("train", context())))
    message = str(e.value)
    assert "more than data.max_image_pixels=89478485 pixels" in message
    assert "digit_1/huge.png" in message and "10000000000" in message
    caplog.set_level("WARNING")
    config = files_config(data, **{"data.skip_bad": True, "data.global_batch_size": 8})
    skipping = get_task(config).data
    assert len(skipping.kept("train")) == 60
    assert skipping.skipped["train"] == [os.path.join(data["train"], "digit_1", "huge.png")]
    # The limit is the config's: the digits' 64 pixels are too many for 63.
    small = files_config(data, **{"data.max_image_pixels": 63, "data.global_batch_size": 4})
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_image_pixels=63"):
        next(iter(get_task(small).build_inputs("train", context())))


def test_bad_data_configs_are_named(tmp_path, digits_files):
    x, y = image_data.digits(20)
    odd_keys = image_data.write_tfrecords(tmp_path / "odd" / "r", x, y, shards=1,
                                          keys=("jpeg", "class"))
    with pytest.raises(ValueError, match=r"has no feature \['image/encoded', "
                       r"'image/class/label'\] \(its records have \['class', 'jpeg'\]\)"):
        get_task(files_config(dict(format="tfrecord", train=odd_keys, eval=odd_keys,
                                         num_classes=10))).data.source("train")
    ok = get_task(files_config(dict(format="tfrecord", train=odd_keys, eval=odd_keys,
                                          num_classes=10, image_key="jpeg",
                                          label_key="class")))
    assert ok.data.source("train").size == 20
    narrow = get_task(files_config(dict(format="tfrecord", train=odd_keys,
                                              eval=odd_keys, num_classes=5, image_key="jpeg",
                                              label_key="class"),
                                         **{"data.global_batch_size": 20}))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Labels outside \[0, 5\)[\s\S]*r-00000-of-00001 record"):
        next(iter(narrow.build_inputs("train", context())))
    with pytest.raises(ValueError, match=r"Labels outside \[0, 5\) \(data.num_classes\): "
                                         r"\S+r-00000-of-00001 record \d+: [5-9]"):
        get_task(override(narrow.config.copy_and_resolve_references(),
                                **{"data.skip_bad": True})).data.kept("train")
    image_data.write_folder(tmp_path / "train", x[y < 5], y[y < 5])
    image_data.write_folder(tmp_path / "eval", x, y)
    with pytest.raises(ValueError, match=r"class folder\(s\) \['digit_5', 'digit_6'"):
        get_task(files_config(dict(format="folder", train=str(tmp_path / "train"),
                                         eval=str(tmp_path / "eval")))).data.source("eval")
    with pytest.raises(ValueError, match="set --config.data.num_classes="):
        get_task(files_config(dict(digits_files["tfrecord"], num_classes=0))
                       ).data.num_classes
    with pytest.raises(ValueError, match=r"data.train is empty: set --config.data.train="):
        get_task(files_config(dict(format="folder"))).data.source("train")


@pytest.mark.e2e
def test_sigkill_and_relaunch_on_tfrecords_ends_bitwise_equal(tmp_path, digits_files):
    """A ResNet (its batch normalization statistics resume too) on TFRecords."""
    data = digits_files["tfrecord"]
    kill_relaunch_and_compare([
        "--config=configs/images.py", "--mode=train", f"--config.data.train={data['train']}",
        f"--config.data.eval={data['eval']}", "--config.data.format=tfrecord",
        "--config.data.num_classes=10", "--config.data.image_size=8",
        "--config.data.global_batch_size=16", "--config.model.width=4",
        "--config.model.blocks_per_stage=1", "--config.precision=float32",
        "--config.distribution.strategy=default", "--config.optimizer.warmup_steps=5",
        "--config.trainer.steps_per_loop=5", "--config.trainer.log_every=5",
        "--config.trainer.checkpoint_every=10", "--config.trainer.train_steps=30",
        "--config.trainer.deterministic=True", "--config.trainer.jit_compile=off"], tmp_path)


def weights(trainer):
    return np.concatenate([w.numpy().ravel() for w in trainer.model.weights])


def test_the_local_tf_data_service_trains_and_reads_each_batch_once(tmp_path,
                                                                   digits_files):
    config = files_config(digits_files["folder"], **{"data.service": "local",
                                                     "data.service_workers": 2})
    trainer = build(config, tmp_path)
    trainer.train(evaluate=False)
    assert int(trainer.step.numpy()) == 20
    plain = get_task(files_config(digits_files["folder"]))
    expected = [fingerprints(x) for x, _ in plain.build_inputs("train", context()).take(
        140).as_numpy_iterator()]
    served = [fingerprints(x) for x, _ in trainer.task.build_inputs(
        "train", context()).take(100).as_numpy_iterator()]
    # Each served batch is one batch of the stream, none twice: one epoch (53 batches of
    # 32 of 1697) holds every example once, as without the service.
    assert all(batch in expected for batch in served)
    assert len({tuple(b) for b in served}) == 100


@pytest.mark.e2e
def test_two_workers_read_what_one_process_reads_and_a_single_process_resumes(
        tmp_path, digits_files):
    """2-process MultiWorkerMirrored (1 replica each) to step 10: at each step the two
    workers' batches are one process's global batch; then one process resumes their
    checkpoint to step 20, as close to an uninterrupted run as reduction order allows."""
    from benchmarks.faults import free_ports
    data_dir = os.path.dirname(digits_files["folder"]["train"])
    cluster = {"worker": [f"localhost:{p}" for p in free_ports(2)]}
    procs = []
    for i in range(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}}))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "support", "multi_worker_files_main.py"),
             data_dir, str(tmp_path / "workers"), str(tmp_path / f"worker{i}.npz")],
            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"w{i}.log", "w")))
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], open(tmp_path / "w0.log").read()[-3000:]
    workers = [np.load(tmp_path / f"worker{i}.npz") for i in range(2)]
    task = get_task(files_config(digits_files["folder"]))
    one = list(task.build_inputs("train", context()).take(6).as_numpy_iterator())
    for k, (x, y) in enumerate(one):
        np.testing.assert_array_equal(
            x, np.concatenate([w["images"][k] for w in workers]))
        np.testing.assert_array_equal(y, np.concatenate([w["labels"][k] for w in workers]))
    np.testing.assert_array_equal(workers[0]["weights"], workers[1]["weights"])

    resumed = build(files_config(digits_files["folder"]), tmp_path / "workers")
    resumed.train(evaluate=False)
    whole = build(files_config(digits_files["folder"]), tmp_path / "whole")
    whole.train(evaluate=False)
    other = build(files_config(digits_files["folder"], seed=1), tmp_path / "other")
    other.train(evaluate=False)
    reduction_noise = np.abs(weights(resumed) - weights(whole)).max()
    another_seed = np.abs(weights(other) - weights(whole)).max()
    assert reduction_noise < 1e-4 < another_seed / 100, (reduction_noise, another_seed)


def test_an_input_bound_run_is_told_the_remedy_that_fits(digits_files, monkeypatch):
    from tasks import image_classification as images_task
    data = digits_files["folder"]
    assert "data.cache=True decodes every image once" in get_task(
        files_config(data)).input_remedy()
    monkeypatch.setattr(images_task, "available_memory_bytes", lambda: 10**3)
    assert "data.service=grpc://host:port decodes on other machines" in get_task(
        files_config(data)).input_remedy()
    assert "more tf.data service workers" in get_task(
        files_config(data, **{"data.service": "local"})).input_remedy()
    assert "from memory" in get_task(
        files_config(data, **{"data.cache": True})).input_remedy()


@pytest.mark.parametrize("fmt", ["folder", "tfds_array_record"])
def test_cache_reads_the_same_batches_from_memory(digits_files, fmt):
    config = files_config(digits_files[fmt], **{"data.augment": True})
    decoded = get_task(config)
    cached = get_task(override(config.copy_and_resolve_references(),
                                     **{"data.cache": True}))
    for split, start in (("train", 5), ("eval", 0)):
        a = list(decoded.build_inputs(split, context(), start).take(8).as_numpy_iterator())
        b = list(cached.build_inputs(split, context(), start).take(8).as_numpy_iterator())
        for (xa, ya), (xb, yb) in zip(a, b):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    assert cached.data.arrays["train"][0].shape == (1697, 8, 8, 3)
    assert "train" not in decoded.data.arrays


@pytest.mark.e2e
def test_a_dispatcher_and_worker_started_by_the_entry_point_serve_a_run(tmp_path,
                                                                        digits_files):
    from benchmarks.faults import free_ports
    dispatcher_port, worker_port = free_ports(2)
    module = [sys.executable, "-m", "trainer.data.service"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    servers = [subprocess.Popen(module + ["--dispatcher", f"--port={dispatcher_port}"],
                                cwd=ROOT, env=env, stderr=subprocess.DEVNULL),
               subprocess.Popen(module + [f"--dispatcher_address=localhost:{dispatcher_port}",
                                          f"--port={worker_port}"],
                                cwd=ROOT, env=env, stderr=subprocess.DEVNULL)]
    try:
        config = files_config(digits_files["folder"], **{
            "data.service": f"grpc://localhost:{dispatcher_port}"})
        served = [fingerprints(x) for x, _ in get_task(config).build_inputs(
            "train", context()).take(20).as_numpy_iterator()]
        expected = [fingerprints(x) for x, _ in get_task(
            files_config(digits_files["folder"])).build_inputs(
            "train", context()).take(20).as_numpy_iterator()]
        assert served == expected  # one worker: the stream's order
        with pytest.raises(ValueError, match="read by Python code"):
            get_task(files_config(digits_files["tfrecord"], **{
                "data.service": f"grpc://localhost:{dispatcher_port}"})).build_inputs(
                "train", context())
    finally:
        for server in servers:
            server.kill()
            server.wait()
