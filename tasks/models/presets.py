"""A pretrained keras_hub backbone and its tokenizer, read from a local preset folder:
the one `save_to_preset` writes (config.json, model.weights.h5, tokenizer.json and
assets/). Nothing is downloaded: a name that is not a folder is refused, with how to
make the folder on a machine that has the network."""

import json
import os

CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.weights.h5", "tokenizer.json"


def keras_hub():
    try:
        import keras_hub
    except ImportError as e:
        raise ImportError("model.backbone names a keras_hub preset folder; keras_hub is in "
                          "the text extra (Python 3.11 or later): pip install -e "
                          "'.[text]'.") from e
    return keras_hub


def check_folder(preset):
    """The preset folder, or an error saying what is missing and what to do."""
    folder = os.path.expanduser(preset)
    if not os.path.isdir(folder):
        raise ValueError(
            f"model.backbone={preset!r} is neither 'transformer' nor a folder. A keras_hub "
            "preset name (e.g. bert_base_en) or a kaggle:// or hf:// handle would be "
            "downloaded, and runs here never download: on a machine with the network, "
            "save it to a folder with  python -c \"import keras_hub as h; "
            f"n='{preset}'; d='my_preset'; h.models.Backbone.from_preset(n)"
            ".save_to_preset(d); h.models.Tokenizer.from_preset(n).save_to_preset(d)\"  "
            "copy the folder here and set --config.model.backbone=<the folder>.")
    for name, what in ((CONFIG, "the backbone's config"), (WEIGHTS, "its weights"),
                       (TOKENIZER, "its tokenizer's config")):
        if not os.path.isfile(os.path.join(folder, name)):
            raise FileNotFoundError(
                f"{os.path.join(folder, name)} is missing: a preset folder holds {what} "
                f"there (Backbone.save_to_preset and Tokenizer.save_to_preset write it).")
    for name in (CONFIG, TOKENIZER):
        path = os.path.join(folder, name)
        try:
            with open(path) as f:
                module = json.load(f).get("module", "")
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"{path} is not a keras_hub config ({e}).") from e
        if not module.startswith("keras_hub."):  # never code from elsewhere
            raise ValueError(f"{path} names a class of {module!r}: only keras_hub's own "
                             "classes are built from a preset folder.")
    return folder


def load_backbone(preset):
    """The backbone with its weights. keras_hub builds a preset saved in a float dtype in
    the global policy (the run's precision); a quantized one keeps its saved dtypes."""
    folder = check_folder(preset)
    try:
        return keras_hub().models.Backbone.from_preset(folder)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{os.path.join(folder, WEIGHTS)} does not fit {os.path.join(folder, CONFIG)} "
            f"({str(e).strip().splitlines()[0][:300]}): save the backbone's weights and "
            "config together (save_to_preset).") from e


def load_tokenizer(preset):
    folder = check_folder(preset)
    try:
        return keras_hub().tokenizers.Tokenizer.from_preset(folder)
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise ValueError(
            f"The tokenizer of {folder} ({TOKENIZER} and assets/) cannot be loaded "
            f"({str(e).strip().splitlines()[0][:300]}): save it with "
            "Tokenizer.save_to_preset into the backbone's folder.") from e
