"""Task registry: `config.task.name` -> Task class."""

from trainer.runtime.plugins import import_module

_REGISTRY = {}


def register(name):
    """Class decorator adding a Task under `name`."""
    def add(cls):
        if name in _REGISTRY:
            raise ValueError(f"Task {name!r} is registered twice.")
        _REGISTRY[name] = cls
        return cls
    return add


def get_task(config):
    """Builds the task named by `config.task.name`, importing `config.task.module` first
    (a Task of the user's own, outside this package, registers itself on import)."""
    if config.task.module:
        import_module(config.task.module, "config.task.module")
    name = config.task.name
    if name not in _REGISTRY:
        raise ValueError(f"Unknown task {name!r} (config.task.name). Known tasks: "
                         f"{', '.join(sorted(_REGISTRY))}. A task of your own: set "
                         "config.task.module to the module that registers it.")
    return _REGISTRY[name](config)


from tasks import cifar10, images, lm  # noqa: E402,F401  (register their tasks)
