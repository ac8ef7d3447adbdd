"""The workdir: checks it is usable (outside the data too) and writes its files from the
chief process only. Its lock is trainer/state/workdir_lock.py.

Every file goes through `tf.io.gfile`, so a workdir may live on any filesystem
TensorFlow supports (a local path, `gs://...`, `ram://...` in tests).
"""

import glob
import json
import os
import re

import tensorflow as tf
from trainer.state.workdir_lock import is_local


gfile = tf.io.gfile


def check_workdir(workdir):
    """Creates `workdir` if needed, or fails with what is wrong with it (nothing inside is
    touched)."""
    if gfile.exists(workdir) and not gfile.isdir(workdir):
        raise NotADirectoryError(f"--workdir={workdir} is a file, not a directory; "
                                 "choose another --workdir.")
    try:
        gfile.makedirs(workdir)
    except tf.errors.OpError as e:
        raise PermissionError(f"--workdir={workdir} cannot be created ({e.message}); "
                              "choose a writable --workdir.") from e
    if is_local(workdir) and not os.access(workdir, os.W_OK | os.X_OK):
        raise PermissionError(f"--workdir={workdir} is not writable; choose a writable "
                              "--workdir or fix its permissions.")


# Files a run writes, at each depth it writes them: a data glob that matches one of them
# would read the run's own files as data.
_RUN_FILES = ("summary.json", "checkpoints/ckpt-1.index", "train/events.out.tfevents.1.host",
              "export/1/variables/variables.index", "export/1/assets.extra/export.json")


def check_outside_data(workdir, data_paths):
    """Refuses a local `workdir` inside a data folder of `data_paths`, or whose files a
    data glob of them would match (`**` included)."""
    if not is_local(workdir):
        return
    root = os.path.abspath(workdir)
    for path in data_paths:
        if "://" in path:
            continue
        path = os.path.abspath(os.path.expanduser(path))
        if glob.has_magic(path):
            pattern = _glob_regex(path)
            hit = next((os.path.join(root, f) for f in _RUN_FILES
                        if pattern.fullmatch(os.path.join(root, f))), None)
        else:
            hit = root if root == path or root.startswith(path + os.sep) else None
        if hit:
            raise ValueError(
                f"--workdir={workdir} is inside the data ({path}): the run's own files "
                f"({hit}) would be read as data, and the data would change between "
                "launches. Choose a --workdir outside it.")


def _glob_regex(pattern):
    """A regex of what glob.glob(pattern, recursive=True) matches."""
    regex = ""
    for part in re.split(r"(\*\*/|\*\*|\*|\?|\[[^\]/]+\])", pattern):
        if part == "**/":
            regex += "(?:.*/)?"
        elif part in ("**", "*"):
            regex += ".*" if part == "**" else "[^/]*"
        elif part == "?":
            regex += "[^/]"
        elif part.startswith("[") and len(part) > 2:
            regex += "[^" + part[2:] if part[1] == "!" else part
        else:
            regex += re.escape(part)
    return re.compile(regex)


def check_readable_workdir(workdir, mode):
    """A mode that only reads a run (eval, sample, export of the workdir's own
    checkpoints) fails on a workdir that does not exist, before creating anything
    there (a summary, a lock)."""
    if not gfile.isdir(workdir):
        raise FileNotFoundError(
            f"--mode={mode}: --workdir={workdir} does not exist, so it holds no run to read "
            "(nothing was created). Point --workdir at a trained run's directory.")


class ChiefFiles:
    """Writes and deletes workdir files on the chief; a no-op on every other process,
    so the code that writes never has to ask where it runs (like `Summaries`)."""

    def __init__(self, is_chief):
        self.is_chief = is_chief

    def write_text(self, path, text):
        """Atomically where the filesystem allows: a temporary file renamed over `path`,
        so a reader (or a kill) never sees half a file."""
        if self.is_chief:
            gfile.makedirs(os.path.dirname(path))
            with gfile.GFile(path + ".tmp", "w") as f:
                f.write(text)
            gfile.rename(path + ".tmp", path, overwrite=True)

    def write_json(self, path, value):
        self.write_text(path, json.dumps(value, indent=2))

    def remove(self, path):
        """Deletes a file or a whole directory."""
        if not self.is_chief:
            return
        if gfile.isdir(path):
            gfile.rmtree(path)
        else:
            gfile.remove(path)


def read_json(path, what):
    """The JSON in `path`, None if there is none; a damaged file is a clear error."""
    if not gfile.exists(path):
        return None
    try:
        with gfile.GFile(path) as f:
            return json.loads(f.read())
    except ValueError as e:
        raise ValueError(f"{path} ({what}) is not valid JSON ({e}). Move it away; "
                         "nothing was changed.") from e
