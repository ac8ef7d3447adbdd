"""Which checkpoints a directory holds: its state file, checked against the files.

TensorFlow's `get_checkpoint_state` answers "no checkpoint" alike for a missing
state file (`checkpoint`), a damaged one and a read that failed (any OpError on
gs://), and a CheckpointManager built on that answer starts a new run that
writes over the old checkpoints and rotates them away. So the state file is
read here with retries, and the checkpoints are also found from their own
files (`ckpt-N.index`, written last by a save): one the state does not list is
still found, and a writer rewrites the state to list it (`repair_state`).
"""

import os
import re
import time

import tensorflow as tf
from absl import logging
from google.protobuf import text_format
from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState

STATE_FILE = "checkpoint"   # the name CheckpointManager reads and writes
READ_ATTEMPTS = 4           # a transient failure (gs://) is retried before anything is decided
RETRY_SECONDS = 1.0         # doubled after each failed attempt
_NUMBERED = re.compile(r"ckpt-(\d+)")
_told = set()  # (directory, problem) already logged: the evaluator lists every poll


def number(path):
    """N of a checkpoint prefix `.../ckpt-N` (-1 for any other name)."""
    match = _NUMBERED.fullmatch(os.path.basename(path))
    return int(match.group(1)) if match else -1


def read_state(directory):
    """(the paths the state file lists, oldest first, what is wrong with it or None).

    A missing file lists nothing; a damaged one lists nothing and says so; a read
    error is retried READ_ATTEMPTS times, then said.
    """
    path = os.path.join(directory, STATE_FILE)
    for attempt in range(READ_ATTEMPTS):
        try:
            if not tf.io.gfile.exists(path):
                return [], "it is missing"
            text = _read(path)
            break
        except tf.errors.OpError as e:  # (NotFound too: deleted between the two calls)
            if attempt == READ_ATTEMPTS - 1:
                return [], f"it cannot be read after {READ_ATTEMPTS} attempts ({e.message})"
            time.sleep(RETRY_SECONDS * 2 ** attempt)
    state = CheckpointState()
    try:
        text_format.Merge(text, state)
    except text_format.ParseError as e:
        return [], f"it is damaged ({e})"
    if not state.model_checkpoint_path:
        return [], "it is damaged (it names no checkpoint)"
    paths = [p if os.path.isabs(p) or "://" in p else os.path.join(directory, p)
             for p in state.all_model_checkpoint_paths or [state.model_checkpoint_path]]
    return paths, None


def _read(path):
    with tf.io.gfile.GFile(path, "rb") as f:  # (bytes that are no UTF-8: a damaged file)
        return f.read().decode("utf-8", errors="replace")


def found_on_disk(directory):
    """The checkpoints whose files are in `directory`, by their `ckpt-N.index`."""
    indexes = tf.io.gfile.glob(os.path.join(directory, "ckpt-*.index"))
    return [p[:-len(".index")] for p in indexes if number(p[:-len(".index")]) >= 0]


def listed_checkpoints(directory):
    """The checkpoints of `directory`, oldest first: those the state file lists and those
    found from their files. A problem with the state file is logged once (with what was
    found instead) when the files hold any checkpoint."""
    return state_and_problem(directory)[0]


def state_and_problem(directory):
    """(`listed_checkpoints`, what is wrong with the state file as a sentence or None)."""
    listed, problem = read_state(directory)
    found = found_on_disk(directory)
    unlisted = sorted(set(found) - set(listed), key=number)
    newer = not problem and unlisted and number(unlisted[-1]) > max(map(number, listed),
                                                                    default=-1)
    paths = sorted(set(listed) | set(found), key=number)
    if not found or not (problem or newer):  # (no files: a new directory, nothing to lose)
        return paths, None
    if problem:
        problem = (f"The checkpoint state {os.path.join(directory, STATE_FILE)} is not usable: "
                   f"{problem}. Found from the files instead: "
                   f"{', '.join(os.path.basename(p) for p in paths)}.")
    else:  # a save whose files are complete but not yet named (a kill, or one under way)
        problem = (f"{', '.join(map(os.path.basename, unlisted))}: complete, but not yet "
                   f"named in {os.path.join(directory, STATE_FILE)}; listed from its files.")
    if (directory, problem) not in _told:
        _told.add((directory, problem))
        logging.log(logging.WARNING if not newer else logging.INFO, "%s", problem)
    return paths, problem


def latest_checkpoint(directory):
    """The newest checkpoint of `directory` (see `listed_checkpoints`), or None."""
    paths = listed_checkpoints(directory)
    return paths[-1] if paths else None


def repair_state(directory):
    """Rewrites a missing, damaged or incomplete state file to list every checkpoint found
    (so the manager restores the newest and rotates them all away in turn); call it
    where only this process writes `directory`, before its CheckpointManager is built.
    Returns what was wrong, or None."""
    paths, problem = state_and_problem(directory)
    if problem:
        try:
            tf.compat.v1.train.update_checkpoint_state(
                directory, paths[-1], all_model_checkpoint_paths=paths,
                all_model_checkpoint_timestamps=[time.time()] * len(paths))
        except tf.errors.OpError as e:
            raise RuntimeError(
                f"{problem} It cannot be rewritten ({e.message}), and training on would "
                f"write over the checkpoints. Nothing was changed: fix or delete "
                f"{os.path.join(directory, STATE_FILE)} and relaunch.") from e
        logging.warning("Rewrote %s to list %s.", os.path.join(directory, STATE_FILE),
                        ", ".join(os.path.basename(p) for p in paths))
    return problem
