"""Chooses the Keras mixed-precision policy, `auto` by hardware."""

import os

import keras
import tensorflow as tf
from absl import logging

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def _cpu_has_fast_bf16():
    """AMX or AVX512_BF16 make bfloat16 matmuls/convs fast on a CPU (Linux flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool({"amx_bf16", "avx512_bf16"} & flags)


def _is_tpu(strategy):
    return isinstance(strategy, (tf.distribute.TPUStrategy,))


def choose_policy(name, strategy):
    """Returns `(policy_name, reason)` for `config.precision`."""
    if name in POLICIES:
        return name, "set in config.precision"
    if name != "auto":
        raise ValueError(
            f"config.precision={name!r} is not one of {POLICIES + ('auto',)}; "
            "set --config.precision to one of them.")
    if _is_tpu(strategy):
        return "mixed_bfloat16", "TPU: bfloat16 is native"
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        capability = details.get("compute_capability", (0, 0))
        if tuple(capability) >= (7, 0):
            return "mixed_float16", f"GPU compute capability {capability} has float16 Tensor Cores"
        return "float32", f"GPU compute capability {capability} < 7.0 has no float16 Tensor Cores"
    if _cpu_has_fast_bf16():
        return "mixed_bfloat16", "CPU has AMX/AVX512_BF16"
    return "float32", "CPU without AMX/AVX512_BF16"


def set_policy(name, strategy):
    """Sets the global Keras policy (before the model is built); returns its name."""
    policy, reason = choose_policy(name, strategy)
    logging.info("Precision policy %s (%s).", policy, reason)
    if policy == "mixed_float16" and not tf.config.list_physical_devices("GPU") \
            and not _is_tpu(strategy):
        logging.warning(
            "mixed_float16 on a CPU runs about 200x slower than float32 (no fast "
            "float16 kernels; measured 28 vs 5,471 ex/s on the seed CNN). "
            "Use --config.precision=mixed_bfloat16 or float32 here.")
    keras.mixed_precision.set_global_policy(policy)
    return policy


def check_keras_backend():
    """Fails fast where tf.keras would not be Keras 3 or not use TensorFlow."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes"):
        raise RuntimeError(
            "TF_USE_LEGACY_KERAS is set: tf.keras would be Keras 2 (tf_keras), which "
            "this framework does not support. Unset TF_USE_LEGACY_KERAS.")
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"KERAS_BACKEND is {keras.backend.backend()!r}; this framework needs "
            "'tensorflow'. Unset KERAS_BACKEND or set it to tensorflow.")
