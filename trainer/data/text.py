"""Text corpora: a glob of text files read as bytes (issue 40 brings token shards)."""

import glob
import os
import sysconfig

import tensorflow as tf


def corpus_files(pattern):
    """`stdlib` = the running Python's standard library .py files (present offline),
    without the third-party packages installed beneath it. A local pattern may use
    `**`; a remote one (gs://...) is matched by tf.io.gfile.glob, which has no `**`."""
    stdlib = pattern == "stdlib"
    if stdlib:
        pattern = os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py")
    if "://" in pattern:
        matches = [f for f in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(f)]
    else:
        matches = [f for f in glob.glob(os.path.expanduser(pattern), recursive=True)
                   if os.path.isfile(f)]
    files = sorted(f for f in matches if not (stdlib and "-packages" + os.sep in f))
    if not files:
        raise FileNotFoundError(f"data.files={pattern!r} matches no files; point "
                                "--config.data.files at a glob of text files.")
    return files


def read_corpus(pattern, max_bytes=0):
    """All matching files' bytes, concatenated in sorted path order."""
    chunks, total = [], 0
    for path in corpus_files(pattern):
        try:
            with tf.io.gfile.GFile(path, "rb") as f:
                chunk = f.read()
        except (OSError, tf.errors.OpError) as e:
            raise OSError(f"Cannot read {path} (matched by data.files={pattern!r}): {e}") from e
        chunks.append(chunk)
        total += len(chunk)
        if max_bytes and total >= max_bytes:
            break
    data = b"".join(chunks)
    return data[:max_bytes] if max_bytes else data
