"""User code named in the config: a Task module, an action class or function.

Names are dotted import paths (`my_project.tasks`, `my_actions.PrintLoss`).
The command line (trainer/cli.py) puts the config file's own directory last on
`sys.path`, so a file next to the config imports by its bare name, from any
working directory, and never shadows an installed or standard module.
"""

import importlib


def import_module(name, field):
    """Imports module `name`, or fails naming the config `field` that asked for it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):  # the named module itself is missing
            raise ImportError(
                f"{field}={name!r}: no module {e.name!r}. Put {e.name.split('.')[-1]}.py next "
                "to the config file, or its package on PYTHONPATH.") from e
        raise  # the module exists but one of its own imports fails: show that


def import_object(path, field):
    """Imports `module.attribute` (e.g. `my_actions.PrintLoss`)."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{field}={path!r} must be a dotted path, module.attribute "
                         "(e.g. my_actions.PrintLoss).")
    module = import_module(module_name, field)
    if not hasattr(module, attribute):
        raise ImportError(f"{field}={path!r}: module {module_name!r} ({module.__file__}) "
                          f"has no attribute {attribute!r}.")
    return getattr(module, attribute)
