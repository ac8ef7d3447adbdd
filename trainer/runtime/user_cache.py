"""Measurements kept per machine in the user's cache, `$XDG_CACHE_HOME/tftrainer/`
(default `~/.cache/tftrainer/`), outside any workdir: a figure measured once (the
CPU's peak, the jit_compile choice of a model) serves every later run. Delete a
file to measure again. A cache that cannot be read or written costs a
measurement, never the run."""

import json
import os


def path(name):
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                        "tftrainer", name)


def read(name):
    """The cache file's {key: value}; {} if it is missing or unreadable."""
    try:
        with open(path(name)) as f:
            entries = json.load(f)
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def store(name, key, value):
    """Sets `key` in the cache file (replaced whole: never half written); returns where
    it went, or why not."""
    target = path(name)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(f"{target}.{os.getpid()}", "w") as f:
            json.dump(dict(read(name), **{key: value}), f, indent=1)
        os.replace(f"{target}.{os.getpid()}", target)
        return f"cached in {target}"
    except OSError as e:
        return f"not cached: {e}"
