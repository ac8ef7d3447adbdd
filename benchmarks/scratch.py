"""Directories a benchmark makes and may delete again: only its own.

A benchmark rewrites its data and run directories on every run. A path it is given
(`--data`, `--out`) may hold the user's files, so a directory is marked when the
benchmark makes it, and only a marked directory is ever deleted.
"""

import os
import shutil

MARK = ".made_by_tftrainer_benchmarks"


def fresh_directory(path):
    """An empty directory at `path` (marked as the benchmark's), replacing one the
    benchmarks made before; refuses one they did not make that holds anything."""
    if os.path.isdir(path) and os.listdir(path):
        if not os.path.exists(os.path.join(path, MARK)):
            raise SystemExit(f"{path} holds files a benchmark did not write; nothing was "
                             "deleted. Give a new or empty directory.")
        shutil.rmtree(path)
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, MARK), "w").close()
    return path
