"""The shipped configs: each starts from configs/base.py and states only what differs;
the framework reads base's fields without defaults of its own."""

import ast
import importlib
import os
import re

import pytest

from configs import base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, "configs"))
                 if n.endswith(".py") and n not in ("__init__.py", "base.py"))


def flat(config, prefix=""):
    out = {}
    for key, value in config.items():
        if hasattr(value, "items") and len(value):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_starts_from_base(name, monkeypatch):
    calls = []
    original = base.get_config
    monkeypatch.setattr(base, "get_config", lambda: calls.append(1) or original())
    config = importlib.import_module(f"configs.{name}").get_config()
    assert calls == [1], f"configs/{name}.py must build on base.get_config() once"
    # Every framework field is still there (a task replaces `model` and `data` with its
    # own, keeping data.global_batch_size).
    missing = [k for k in flat(original()) if not k.startswith("model")
               and k not in flat(config)]
    assert not missing, missing


def test_configs_import_no_framework_module():
    """A config is read before anything is built: it imports configs and ml_collections."""
    for name in SHIPPED + ["base"]:
        source = open(os.path.join(ROOT, "configs", f"{name}.py")).read()
        assert not re.findall(r"^\s*(?:from|import) (?:trainer|tasks)\b", source, re.M), name


def test_the_framework_reads_base_fields_without_defaults_of_its_own():
    """`config.trainer.get("x", default)` would keep a second default beside base.py's."""
    fields = {k.rsplit(".", 1)[-1] for k in flat(base.get_config())}
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "trainer")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                for node in ast.walk(ast.parse(open(path).read())):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == "get" and len(node.args) == 2
                            and isinstance(node.args[0], ast.Constant)
                            and node.args[0].value in fields
                            and "config" in ast.unparse(node.func.value)):
                        found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not found, found
