"""Text: preparing token shards, reading them, the memory a large corpus takes, what
the document mask and the sampling cache cost, and what subword tokens are worth.

python -m benchmarks.text --out=bench/text                 # every part
python -m benchmarks.text --parts=prepare,input --out=bench/text

--corpus defaults to Debian's python3-doc reST sources (`apt-get install python3-doc`:
497 files, 11 MB of English prose with code): real text that installs offline. Parts:
- prepare: MB/s of a prepare on every core, against the same SentencePiece model encoding
  through its own Python API and the `tokenizers` package's batch encode (2 threads each).
- input: train windows/s read from memory-mapped shards against the same tokens in memory.
- memory: peak resident memory of training on shards larger than half this machine's
  memory (random ids, written here), against the same run on small shards.
- mask: train steps/s of configs/lm.py with and without data.document_mask.
- sampling: tokens/s sampled with the cache of keys and values against the whole window.
- learning: configs/lm.py with SentencePiece against bytes, each trained for --seconds
  (its step count calibrated first, so each finishes its schedule), in held-out bits per
  byte.
Writes results.json and results.md to --out.
"""

import glob
import os
import statistics
import sys
import time

from absl import app, flags

from benchmarks.launched import flags_of, launch, run_parts, steps_per_second
from benchmarks.scratch import fresh_directory

FLAGS = flags.FLAGS
flags.DEFINE_list("parts", ["prepare", "input", "mask", "sampling", "memory", "learning"],
                  "Which parts to run.")
flags.DEFINE_string("corpus", "/usr/share/doc/python3/html/_sources/**/*.txt",
                    "A glob of text files.")
flags.DEFINE_integer("vocab_size", 8000, "SentencePiece pieces.")
flags.DEFINE_float("memory_gb", 13.0, "Size of the large shards of the memory part.")
flags.DEFINE_integer("seconds", 600, "Training time of each run of the learning part.")
flags.DEFINE_integer("input_batches", 3000, "Batches of 32 windows a round of the input part.")
flags.DEFINE_integer("calibration_steps", 300,
                     "Steps that time each run of the learning part.")
flags.DEFINE_string("out", "bench_text", "Output directory.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPM = "spm.model"


def corpus_files():
    files = sorted(f for f in glob.glob(FLAGS.corpus, recursive=True) if os.path.isfile(f))
    if not files:
        raise SystemExit(f"--corpus={FLAGS.corpus} matches nothing: apt-get install "
                         "python3-doc, or give a glob of text files.")
    return files


def part_prepare(out):
    from trainer.data import prepare_text
    from trainer.data.tokenizers import ByteTokenizer, SentencePieceTokenizer
    files = corpus_files()
    texts = [open(f, "rb").read() for f in files]
    megabytes = sum(map(len, texts)) / 1e6
    start = time.monotonic()
    tokenizer = SentencePieceTokenizer.train(texts, FLAGS.vocab_size)
    rows = {"corpus_mb": megabytes, "documents": len(texts),
            "train_vocabulary_s": time.monotonic() - start}
    with open(os.path.join(out, SPM), "wb") as f:
        f.write(tokenizer.model_proto)
    for name, tok in (("bytes", ByteTokenizer()), ("sentencepiece", tokenizer)):
        for processes in (1, 2):
            start = time.monotonic()
            prepare_text.prepare(os.path.join(out, f"shards_{name}"), files, [], tok,
                                 processes=processes)
            rows[f"prepare_{name}_{processes}p_mb_s"] = megabytes / (time.monotonic() - start)
    strings = [t.decode("utf-8", errors="replace") for t in texts]
    start = time.monotonic()
    ours = tokenizer.processor.encode(strings, num_threads=2)
    rows["sentencepiece_api_2t_mb_s"] = megabytes / (time.monotonic() - start)
    import sentencepiece.sentencepiece_model_pb2 as model_pb2
    sys.modules["sentencepiece_model_pb2"] = model_pb2  # where from_spm looks for it
    from tokenizers.implementations import SentencePieceUnigramTokenizer
    theirs = SentencePieceUnigramTokenizer.from_spm(os.path.join(out, SPM))
    os.environ["RAYON_NUM_THREADS"] = "2"
    start = time.monotonic()
    encoded = theirs.encode_batch(strings)
    rows["tokenizers_batch_2t_mb_s"] = megabytes / (time.monotonic() - start)
    # from_spm adds a dummy prefix piece; the rest is compared
    rows["tokenizers_same_ids_share"] = statistics.mean(
        e.ids[1:] == o or e.ids == o for e, o in zip(encoded, ours))
    return rows


def lm_config(out, kind, **overrides):
    from configs import lm
    c = lm.get_config()
    c.distribution.strategy = "default"
    c.data.update(train="", prepared=os.path.join(out, f"shards_{kind}"))
    c.tokenizer.update(kind=kind, model=os.path.join(out, SPM) if kind != "bytes" else "")
    for key, value in overrides.items():
        section, field = key.split(".")
        c[section][field] = value
    return c


def part_input(out):
    import numpy as np
    import tensorflow as tf
    from trainer.data.token_shards import Split
    from trainer.task import get_task
    task = get_task(lm_config(out, "sentencepiece"))
    where, tokenizer, mapped, held_out = task.corpus
    in_memory = Split(np.array(mapped.tokens), np.array(mapped.offsets))
    context = tf.distribute.InputContext()
    batches = FLAGS.input_batches

    def windows_per_second(split):
        task._corpus = (where, tokenizer, split, held_out)
        dataset = task.build_inputs("train", context)
        for _ in dataset.take(50):  # warm up
            pass
        start = time.monotonic()
        for _ in dataset.take(batches):
            pass
        return batches * 32 / (time.monotonic() - start)

    rates = {"mapped": [], "memory": []}
    for _ in range(7):  # alternating: the machine's drift hits both alike
        for name, split in (("mapped", mapped), ("memory", in_memory)):
            rates[name].append(windows_per_second(split))
    mapped_rate, memory_rate = (statistics.median(rates[k]) for k in ("mapped", "memory"))
    return {"mapped_windows_s": mapped_rate, "memory_windows_s": memory_rate,
            "mapped_range": f"{min(rates['mapped']):.0f}-{max(rates['mapped']):.0f}",
            "memory_range": f"{min(rates['memory']):.0f}-{max(rates['memory']):.0f}",
            "tokens_per_window": 128, "mapped_over_memory": mapped_rate / memory_rate}


def write_random_shards(directory, tokenizer, gigabytes):
    """Shards of random ids < 256 (valid for both tokenizers): documents of 4,096 tokens
    (1,024 of them, repeated)."""
    import numpy as np
    from trainer.data import token_shards
    token_shards.begin(directory, ("train", "eval"), tokenizer.identity)
    pool = np.random.default_rng(0).integers(0, 256, (1024, 4096), dtype=np.uint16)
    for split, size in (("train", gigabytes), ("eval", 0.01)):
        writer = token_shards.SplitWriter(directory, split, tokenizer.identity)
        for i in range(int(size * 1e9 / 2 / 4097)):
            writer.add(pool[i % len(pool)], f"random {i}")
        token_shards.commit(directory, {split: writer.close()})


def part_memory(out):
    from trainer.data import token_shards
    from trainer.data.tokenizers import ByteTokenizer, SentencePieceTokenizer
    rows = {}
    spm = SentencePieceTokenizer.load(os.path.join(out, SPM))
    run = {"trainer.train_steps": 100, "trainer.steps_per_loop": 50, "trainer.log_every": 50,
           "trainer.checkpoint_every": 0, "optimizer.warmup_steps": 10,
           "data.eval_windows": 64, "sample.summary_tokens": 0}
    for kind, tokenizer in (("bytes", ByteTokenizer()), ("sentencepiece", spm)):
        for size, gigabytes in (("small", 0.1), ("large", FLAGS.memory_gb)):
            directory = os.path.join(out, f"random_{kind}_{size}")
            if token_shards.tokenizer(directory) != tokenizer.identity:  # (else kept)
                write_random_shards(fresh_directory(directory), tokenizer, gigabytes)
            if kind == "sentencepiece":
                with open(os.path.join(directory, "tokenizer.model"), "wb") as f:
                    f.write(spm.model_proto)
            args = ["--config=configs/lm.py", "--mode=train", "--config.data.train=",
                    f"--config.data.prepared={directory}", f"--config.tokenizer.kind={kind}",
                    f"--config.tokenizer.vocab_size={tokenizer.identity['vocab_size']}",
                    *flags_of(run)]
            workdir = fresh_directory(os.path.join(out, "runs", f"memory_{kind}_{size}"))
            _, _, peak = launch(args, workdir)
            rows[f"{kind}_{size}_peak_mb"] = peak
            rows[f"{kind}_{size}_shard_gb"] = gigabytes
        rows[f"{kind}_growth_mb"] = (rows[f"{kind}_large_peak_mb"]
                                     - rows[f"{kind}_small_peak_mb"])
    return rows


def tokenizer_flags(out, kind):
    """The prepare part's SentencePiece model (its shards are prepared again once, by the
    first run, to record what they were made of)."""
    return [f"--config.tokenizer.kind={kind}",
            f"--config.tokenizer.vocab_size={FLAGS.vocab_size}",
            f"--config.tokenizer.model={os.path.join(out, SPM) if kind != 'bytes' else ''}"]


def part_mask(out):
    rows = {}
    for kind in ("bytes", "sentencepiece"):
        for mask in (False, True):
            args = ["--config=configs/lm.py", "--mode=train",
                    f"--config.data.train={FLAGS.corpus}",
                    f"--config.data.prepared={os.path.join(out, f'shards_{kind}')}",
                    *tokenizer_flags(out, kind), f"--config.data.document_mask={mask}",
                    "--config.trainer.train_steps=400", "--config.trainer.checkpoint_every=0",
                    "--config.trainer.jit_compile=off", "--config.sample.summary_tokens=0"]
            workdir = fresh_directory(os.path.join(out, "runs", f"mask_{kind}_{mask}"))
            stderr, _, _ = launch(args, workdir)
            rows[f"{kind}_mask_{mask}_steps_s"] = steps_per_second(stderr)
        rows[f"{kind}_mask_cost"] = 1 - rows[f"{kind}_mask_True_steps_s"] / rows[
            f"{kind}_mask_False_steps_s"]
    return rows


def part_sampling(out):
    import numpy as np
    import tensorflow as tf
    from tasks.models.generation import Sampler
    from trainer.task import get_task
    task = get_task(lm_config(out, "sentencepiece"))
    model, seq_len, tokens = task.build_model(), task.seq_len, 256
    sampler = Sampler(model, task.graph_tokenizer, seq_len)
    prompt = tf.constant(["The tokenizer reads the text"])
    sampler.generate(prompt, 8)  # traces
    start = time.monotonic()
    sampler.generate(prompt, tokens)
    cached = tokens / (time.monotonic() - start)

    @tf.function
    def next_logits(window, position):  # the whole window for each token, as before
        return model(window, training=False)[0, position]

    window = np.zeros((1, seq_len), np.int32)
    next_logits(tf.constant(window), tf.constant(0))
    start = time.monotonic()
    out_tokens = [1]
    for _ in range(tokens):
        context = out_tokens[-seq_len:]
        window[0, :len(context)] = context
        logits = next_logits(tf.constant(window), tf.constant(len(context) - 1))
        out_tokens.append(int(tf.argmax(logits)))
    whole = tokens / (time.monotonic() - start)
    return {"cached_tokens_s": cached, "whole_window_tokens_s": whole,
            "speedup": cached / whole}


def part_learning(out):
    rows = {}
    for kind in ("bytes", "sentencepiece"):
        common = ["--config=configs/lm.py", "--mode=train_and_eval",
                  f"--config.data.train={FLAGS.corpus}",
                  f"--config.data.prepared={os.path.join(out, f'shards_{kind}')}",
                  *tokenizer_flags(out, kind), "--config.trainer.jit_compile=off"]
        calibration = fresh_directory(os.path.join(out, "runs", f"calibrate_{kind}"))
        every = max(FLAGS.calibration_steps // 5, 1)
        stderr, _, _ = launch(common + [
            f"--config.trainer.train_steps={FLAGS.calibration_steps}",
            f"--config.trainer.steps_per_loop={every}", f"--config.trainer.log_every={every}",
            f"--config.optimizer.warmup_steps={every}", "--config.trainer.eval_every=0"],
            calibration)
        steps = int(FLAGS.seconds * steps_per_second(stderr))
        workdir = fresh_directory(os.path.join(out, "runs", f"learn_{kind}"))
        _, summary, _ = launch(common + [f"--config.trainer.train_steps={steps}",
                                         f"--config.trainer.eval_every={steps // 4}",
                                         f"--config.optimizer.warmup_steps={steps // 15}"],
                               workdir)
        rows[f"{kind}_steps"] = steps
        rows[f"{kind}_seconds"] = summary["seconds"]
        rows[f"{kind}_eval_bits_per_byte"] = summary["eval"]["bits_per_byte"]
    return rows


PARTS = {"prepare": part_prepare, "input": part_input, "memory": part_memory,
         "mask": part_mask, "sampling": part_sampling, "learning": part_learning}


def main(argv):
    del argv
    prepared = "prepare" in FLAGS.parts or os.path.exists(os.path.join(FLAGS.out, SPM))
    if not prepared:  # (it runs first when asked for: PARTS' order)
        raise SystemExit(f"--parts={','.join(FLAGS.parts)} reads what the prepare part "
                         "writes: run it first.")
    run_parts(sorted(FLAGS.parts, key=lambda p: p != "prepare"), PARTS, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
