"""Tiny labeled texts and tiny keras_hub presets, made by the tests themselves: a few
hundred short texts in 3 classes (as a class folder, JSONL and CSV), and a BERT-like
and a GPT-2-like backbone saved with `save_to_preset` (no network)."""

import csv
import json
import os

import numpy as np

WORDS = {
    "weather": "rain sun cloud wind storm snow cold warm forecast sky".split(),
    "sports": "goal team match score player coach ball league win season".split(),
    "cooking": "salt oven bake recipe flour sugar pan boil soup knife".split(),
}
COMMON = "the a today we saw very much and then again it was".split()


def texts(n=300, seed=0):
    """[(text, label)]: n sentences, each mostly common words and a few of its class's."""
    rng = np.random.default_rng(seed)
    labels = sorted(WORDS)
    examples = []
    for i in range(n):
        label = labels[i % len(labels)]
        words = list(rng.choice(COMMON, 6)) + list(rng.choice(WORDS[label], 3))
        rng.shuffle(words)
        examples.append((" ".join(words), label))
    return examples


def write_folder(root, examples):
    for i, (text, label) in enumerate(examples):
        os.makedirs(os.path.join(root, label), exist_ok=True)
        with open(os.path.join(root, label, f"{i:05d}.txt"), "w") as f:
            f.write(text)
    return str(root)


def write_jsonl(path, examples, text_key="text", label_key="label"):
    with open(path, "w") as f:
        for text, label in examples:
            f.write(json.dumps({text_key: text, label_key: label}) + "\n")
    return str(path)


def write_csv(path, examples):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(examples)
    return str(path)


def tiny_bert_preset(directory, seq_len=32):
    """A 2-layer BERT backbone and its WordPiece tokenizer over these texts' words."""
    import keras_hub
    vocabulary = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                  + sorted({w for ws in WORDS.values() for w in ws} | set(COMMON)))
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(vocabulary), num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=seq_len)
    backbone.save_to_preset(str(directory))
    tokenizer.save_to_preset(str(directory))
    return str(directory)


def tiny_gpt2_preset(directory, seq_len=64):
    """A 2-layer GPT-2 backbone and a byte-level BPE over these texts' words."""
    import keras_hub
    words = sorted({w for ws in WORDS.values() for w in ws} | set(COMMON))
    letters = sorted({c for w in words for c in w})
    vocabulary = {"<|endoftext|>": 0, "Ġ": 1}
    for piece in letters + ["Ġ" + c for c in letters]:
        vocabulary.setdefault(piece, len(vocabulary))
    merges = [f"Ġ {c}" for c in letters]  # a space joins the letter after it
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=len(vocabulary), num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=seq_len)
    backbone.save_to_preset(str(directory))
    tokenizer.save_to_preset(str(directory))
    return str(directory)


def tiny_text_config(data, **overrides):
    """configs/text.py shrunk: a 1-block transformer on bytes, 20 steps of 16."""
    from configs import text
    from support import override
    c = text.get_config()
    c.data.update(global_batch_size=16, **data)
    c.tokenizer.kind = "bytes"
    c.model.update(seq_len=48, num_layers=1, d_model=32, num_heads=2, mlp_dim=64)
    c.precision = "float32"
    c.distribution.strategy = "default"
    c.optimizer.update(learning_rate=3e-3, warmup_steps=2)
    c.trainer.update(train_steps=20, steps_per_loop=5, log_every=5, eval_every=10,
                     checkpoint_every=10, per_step_summaries=False, jit_compile="off")
    return override(c, **overrides)
