"""SavedModel export: a fresh process serves what the trained model predicts."""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.task import get_task
from trainer.data.images.preprocess import normalize
from support import build, tiny_config
from trainer.cli import execute
from trainer.actions.export import export

# Loads each export in a process of its own, as a server would, and saves its outputs.
SERVE = """
import sys, numpy as np, tensorflow as tf
for directory, inputs, out in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
    serve = tf.saved_model.load(directory).signatures["serving_default"]
    (name, spec), = serve.structured_input_signature[1].items()
    result = serve(**{name: tf.constant(np.load(inputs), spec.dtype)})
    np.savez(out, name=name, **{k: v.numpy() for k, v in result.items()})
"""


def serve_in_fresh_process(tmp_path, exports):
    """{export dir: inputs} -> {export dir: the outputs a fresh process serves}."""
    args = []
    for i, (directory, inputs) in enumerate(exports.items()):
        np.save(tmp_path / f"in{i}.npy", inputs)
        args += [directory, str(tmp_path / f"in{i}.npy"), str(tmp_path / f"out{i}.npz")]
    run = subprocess.run([sys.executable, "-c", SERVE] + args, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert run.returncode == 0, run.stderr[-3000:]
    return {d: dict(np.load(tmp_path / f"out{i}.npz")) for i, d in enumerate(exports)}


@pytest.mark.e2e
def test_a_fresh_process_serves_the_trained_models_predictions(tmp_path):
    # CIFAR trained in mixed_bfloat16, exported by the end-of-training action (float32).
    cifar = build(tiny_config(precision="mixed_bfloat16", **{
        "trainer.train_steps": 4, "data.normalization": "standardize"}), tmp_path / "cifar")
    cifar.config.unlock().export.enabled = True
    cifar.train()
    best_step = json.load(open(tmp_path / "cifar/best/best.json"))["step"]
    cifar_dir = str(tmp_path / "cifar/export" / str(best_step))
    images = np.random.default_rng(0).integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    served = serve_in_fresh_process(tmp_path, {cifar_dir: images})

    assert str(served[cifar_dir]["name"]) == "images"
    metadata = json.load(open(os.path.join(cifar_dir, "assets.extra/export.json")))
    assert metadata["compute_dtype"] == "float32" and metadata["inputs"]["images"]["dtype"] == "uint8"
    assert metadata["training_precision"] == "mixed_bfloat16"
    # The in-memory model, at the exported weights, in float32 and in bfloat16.
    cifar.restore(metadata["checkpoint"])
    features = normalize(images, "standardize")
    keras.mixed_precision.set_global_policy("float32")
    float32_model = cifar.task.build_model()
    float32_model.set_weights([w.numpy() for w in cifar.model.weights])
    expected = float32_model(features, training=False).numpy()
    logits = served[cifar_dir]["logits"]
    assert logits.dtype == np.float32 and served[cifar_dir]["probabilities"].dtype == np.float32
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(served[cifar_dir]["probabilities"],
                               tf.nn.softmax(expected).numpy(), atol=1e-5)
    bfloat16_logits = cifar.model(features, training=False).numpy()
    np.testing.assert_allclose(logits, bfloat16_logits, atol=0.1)  # bfloat16's precision



def test_a_bad_checkpoint_is_a_clear_error_and_writes_nothing(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 2, "trainer.best_metric": ""})
    task = get_task(config)
    with pytest.raises(FileNotFoundError, match="no checkpoint in .* Train first"):
        export(config, task, str(tmp_path))
    build(config, tmp_path).train(evaluate=False)
    data = tf.io.gfile.glob(str(tmp_path / "checkpoints/ckpt-2.data*"))[0]
    with open(data, "r+b") as f:  # damage the latest checkpoint's values
        f.truncate(100)
    with pytest.raises(ValueError, match="Cannot export checkpoint .*ckpt-2.*nothing was"):
        export(config, task, str(tmp_path))
    config.export.checkpoint = str(tmp_path / "checkpoints/ckpt-7")
    with pytest.raises(ValueError, match="Cannot export checkpoint .*ckpt-7"):
        export(config, task, str(tmp_path))
    assert not (tmp_path / "export").exists()


def test_an_export_cut_short_is_never_taken_for_a_whole_one(tmp_path, caplog):
    config = tiny_config(**{"trainer.train_steps": 2, "trainer.best_metric": ""})
    task = get_task(config)
    build(config, tmp_path).train(evaluate=False)
    directory = export(config, task, str(tmp_path))
    assert os.path.exists(os.path.join(directory, "assets.extra", "COMPLETE"))
    # A rename on gs:// copies object by object: a crash left the metadata, not the rest.
    shutil.rmtree(os.path.join(directory, "variables"))
    os.remove(os.path.join(directory, "assets.extra", "COMPLETE"))
    assert export(config, task, str(tmp_path)) == directory
    assert any("without its completion mark" in r.getMessage() for r in caplog.records)
    assert os.path.exists(os.path.join(directory, "assets.extra", "COMPLETE"))
    served = tf.saved_model.load(directory).signatures["serving_default"]
    assert "probabilities" in served(images=tf.zeros([1, 32, 32, 3], tf.uint8))
    # A directory of another tool's files is never replaced.
    other = tmp_path / "export" / "2"
    shutil.rmtree(other)
    (other / "mine").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="no assets.extra/export.json: files of another"):
        export(config, task, str(tmp_path))
    assert (other / "mine").exists()


def test_an_export_in_the_training_policy_keeps_its_float32_layers(tmp_path):
    config = tiny_config(precision="mixed_bfloat16", **{"trainer.train_steps": 2,
                                                        "trainer.best_metric": ""})
    config.precision_overrides.float32_layers = (".*conv2d.*",)
    config.export.compute_dtype = "training"
    trainer = build(config, tmp_path)
    trainer.train(evaluate=False)
    execute(config, str(tmp_path), "export")
    metadata = json.load(open(tmp_path / "export/2/assets.extra/export.json"))
    assert metadata["compute_dtype"] == "training"
    images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    served = tf.saved_model.load(str(tmp_path / "export/2")).signatures["serving_default"](
        images=tf.constant(images))["logits"].numpy()
    # Compiled like the served graph: Grappler fuses ops there (matmul + bias + relu),
    # which rounds differently in bfloat16 than the eager ops one by one.
    expected = tf.function(trainer.model)(normalize(images, "unit_range")).numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-5)  # same dtypes
    float32 = tiny_config(precision="float32")
    keras.mixed_precision.set_global_policy("float32")
    reference = get_task(float32).build_model()
    reference.set_weights([w.numpy() for w in trainer.model.weights])
    assert np.abs(served - reference(normalize(images, "unit_range"))).max() > 0
