"""The Keras mixed-precision policy: chosen by config or hardware (`auto`), with
per-layer float32 overrides, and advice on shapes the matrix units want."""

import collections
import math
import os
import re

import keras
import tensorflow as tf
from absl import logging

from trainer.runtime.keras_internals import sublayers

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


def policy_name():
    """The global policy's name (`mixed_float16`, ...), also under float32 overrides."""
    policy = keras.mixed_precision.global_policy()
    return getattr(policy, "default_policy", policy).name


def use_float32_layers(patterns):
    """Makes layers built from now on whose `layer.path` fully matches a pattern in
    `patterns` compute in float32; the others keep the global policy.

    Keras' own per-layer mechanism: the global policy becomes a DTypePolicyMap,
    which every layer built without an explicit dtype consults by its path. The
    variables are float32 under every policy, so checkpoints do not change.
    """
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"precision_overrides.float32_layers: {pattern!r} is not a "
                             f"regular expression ({e}).") from e
    name = policy_name()
    if not patterns or name == "float32":
        return
    # One key (several keys matching one path is an error in Keras), and a match covers
    # the layer's sublayers too.
    one_key = "|".join(f"(?:{p})(?:/.*)?" for p in patterns)
    keras.mixed_precision.set_global_policy(keras.dtype_policies.DTypePolicyMap(
        default_policy=keras.dtype_policies.DTypePolicy(name),
        policy_map={one_key: keras.dtype_policies.DTypePolicy("float32")}))


def layers_of(model):
    """The model's layers that have a path, each after its parent."""
    return [layer for layer in sublayers(model) if layer.path]


def check_float32_layers(model, patterns):
    """Fails on a pattern that matches no layer; extends the override to sublayers
    without a path; logs the compute dtypes, grouped."""
    paths = [layer.path for layer in layers_of(model)]
    for pattern in patterns:
        if not any(re.fullmatch(pattern, path) for path in paths):
            step = max(1, len(paths) // 8)
            raise ValueError(
                f"precision_overrides.float32_layers: {pattern!r} matches no layer path (a "
                "pattern must match a whole path: '.*name.*' for a name anywhere). Some paths "
                f"of this model: {', '.join(paths[::step][:8])}.")
    def matched(layer):
        return bool(layer.path) and any(re.fullmatch(f"(?:{p})(?:/.*)?", layer.path)
                                        for p in patterns)

    def cover_pathless(layer, inherited):
        # Keras gives a path only to layers that build (not Softmax, Dropout, ...), so
        # DTypePolicyMap never sees them: they follow their matched parent here.
        for child in sublayers(layer, recursive=False):
            if child.path:
                cover_pathless(child, matched(child))
            else:
                if inherited and policy_name() != "float32":
                    child.dtype_policy = "float32"
                cover_pathless(child, inherited)

    cover_pathless(model, matched(model))
    for layer in layers_of(model):
        if matched(layer) and layer.compute_dtype != "float32":
            logging.warning("%s matches precision_overrides.float32_layers but its code "
                            "sets dtype %s explicitly: it stays so.", layer.path,
                            layer.compute_dtype)
    groups = collections.defaultdict(list)
    for layer in layers_of(model):
        groups[(layer.compute_dtype, type(layer).__name__)].append(layer.path)
    lines = [f"  {dtype:9s} {cls} x{len(group)}: {', '.join(group[:3])}"
             + (f", ... (+{len(group) - 3})" if len(group) > 3 else "")
             for (dtype, cls), group in sorted(groups.items())]
    logging.info("Layer compute dtypes (policy %s, float32_layers %s):\n%s", policy_name(),
                 list(patterns) or "none", "\n".join(lines))


def misaligned_shapes(model, multiple):
    """[(layer path, description, {dimension: (size, suggested size)})] for the layers
    whose matmul or convolution dimensions are not multiples of `multiple`."""
    found = []
    for layer in layers_of(model):
        kernel = (layer.embeddings if isinstance(layer, keras.layers.Embedding)
                  else getattr(layer, "kernel", None))
        if kernel is None or len(kernel.shape) < 2 or layer.compute_dtype == "float32":
            continue  # (a float32 layer does not use the 16-bit matrix units)
        shape = [int(d) for d in kernel.shape]
        odd = {dim: (size, _round_up(size, multiple))
               for dim, size in _matmul_sizes(layer, shape).items() if size % multiple}
        if odd:
            found.append((layer.path, f"{type(layer).__name__} {'x'.join(map(str, shape))}",
                          odd))
    return found


def _matmul_sizes(layer, shape):
    """The sizes a matrix unit tiles: contraction and output of a Dense or EinsumDense,
    the filters of a convolution (its input channels are the previous layer's filters,
    or the image's), the vocabulary and width of an Embedding, a head's width."""
    if getattr(layer, "equation", None):  # EinsumDense: kernel letters the input also has
        inputs, kernel_spec = layer.equation.split("->")[0].split(",")
        contracted = [n for letter, n in zip(kernel_spec, shape) if letter in inputs]
        output = [n for letter, n in zip(kernel_spec, shape) if letter not in inputs]
        return {"in": math.prod(contracted), "out": math.prod(output)}
    if hasattr(layer, "filters") and hasattr(layer, "kernel_size"):
        # a transposed convolution's kernel is (..., filters, input channels)
        return {"filters": shape[-2] if "Transpose" in type(layer).__name__ else shape[-1]}
    return {"in": shape[0], "out": math.prod(shape[1:])}


def _round_up(size, multiple):
    return -(-size // multiple) * multiple


def advise_shapes(model, sizes, strategy):
    """One WARNING naming the shapes that leave the matrix units partly idle under a
    mixed policy: multiples of 8 for GPU Tensor Cores, 128 for TPU matrix units.
    `sizes`: other dimensions to check, e.g. {"per-replica batch": 12}."""
    name = policy_name()
    if name == "float32":
        return []
    multiple, unit = (128, "TPU matrix units") if _is_tpu(strategy) else (8, "GPU Tensor Cores")
    found = misaligned_shapes(model, multiple)
    found += [(what, "", {"size": (n, _round_up(n, multiple))})
              for what, n in sizes.items() if n and n % multiple]
    for layer in layers_of(model):  # a head's width is the attention matmul's
        key_dim = getattr(layer, "key_dim", None)
        if isinstance(key_dim, int) and key_dim % multiple:
            found.append((layer.path, type(layer).__name__,
                          {"head dim": (key_dim, _round_up(key_dim, multiple))}))
    if found:
        groups = collections.defaultdict(list)  # identical layers, one line
        for path, description, odd in found:
            advice = ", ".join(f"{dim} {n} -> {m}" for dim, (n, m) in odd.items())
            groups[(description, advice)].append(path)
        lines = [f"  {', '.join(paths[:3])}{f' (+{len(paths) - 3})' if len(paths) > 3 else ''}"
                 f"{f' [{description}]' if description else ''}: {advice}"
                 for (description, advice), paths in groups.items()]
        logging.warning("Under %s, these sizes are not multiples of %d, which %s want:\n%s",
                        name, multiple, unit, "\n".join(lines))
    return found


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


check_keras_backend()  # every model goes through this module: fail before building one
