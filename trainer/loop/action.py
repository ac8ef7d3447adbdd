"""The Action contract: what the host does between compiled chunks of train steps.

The Controller runs the compiled loop up to the next step where an action is
due, then calls the due actions in order. Logging, checkpointing, evaluation
and the best checkpoint are actions like the ones a user writes:

    class PrintLoss(Action):
        def __call__(self, controller, step, logs):
            print(step, logs["train/loss"])

and adds from a config, with no change to the framework:

    c.actions.print_loss = dict(action="my_actions.PrintLoss", every=100)

`logs` holds what the actions before this one produced at this step:
`train/<metric>` when the train metrics were logged, `eval/<metric>` when the
model was evaluated.
"""

from trainer.runtime.plugins import import_object


class Action:
    """Something to do at some steps. Subclass it and implement `__call__`.

    every: run at steps that are multiples of it (0: never in mid-run).
    at_end: also run once training is over (train_steps reached, or an early
        stop).
    on_interrupt: also run when a signal or the time budget stops the run to
        be resumed later; other actions are skipped then, to save quickly.
    chief_only: run on the chief process alone (for actions that only write
        files). Otherwise every worker calls it at the same step, so it may
        hold collectives (save, evaluate) under MultiWorkerMirroredStrategy.
    kind: where its time goes in `summary.json` ("eval", "checkpoint", "other"). The
        Controller also foresees, before a stop, the time of the actions that run on
        an interrupt with kind "checkpoint" (the save a stop makes).
    """

    every = 0
    at_end = True
    on_interrupt = False
    chief_only = False
    kind = "other"

    def begin(self, controller):
        """Called once before the first step of `Controller.train`, on every worker."""

    def end(self, controller):
        """Called once when `Controller.train` ends, however it ends (an exception too),
        on every worker: release what the action holds."""

    def boundaries(self):
        """Steps, besides the multiples of `every`, where a compiled chunk must end so
        that `should_run` sees them."""
        return ()

    def should_run(self, controller, step, logs):
        """Whether to run at this boundary (`controller.done`: training is over;
        `controller.interrupted`: why the run stops to be resumed, or None)."""
        return (every(step, self.every) or (self.at_end and controller.done)
                or (self.on_interrupt and controller.interrupted is not None))

    def __call__(self, controller, step, logs):
        raise NotImplementedError


class FunctionAction(Action):
    """A plain function `fn(controller, step, logs, **kwargs)` as an action."""

    def __init__(self, fn, **kwargs):
        self.fn, self.kwargs = fn, kwargs

    def __call__(self, controller, step, logs):
        self.fn(controller, step, logs, **self.kwargs)


def from_config(actions_config):
    """The user's actions, from `config.actions`: {name: {action: "module.Name",
    every: N, at_end: bool, **constructor keyword arguments}}, in name order."""
    actions = []
    for name in sorted(actions_config or {}):
        entry = dict(actions_config[name])
        field = f"config.actions.{name}"
        if "action" not in entry:
            raise ValueError(f"{field} needs an `action`: the dotted path of an Action "
                             "class or function, e.g. action='my_actions.PrintLoss'.")
        target = import_object(entry.pop("action"), f"{field}.action")
        schedule = {k: entry.pop(k) for k in ("every", "at_end") if k in entry}
        if isinstance(target, type) and issubclass(target, Action):
            action = target(**entry)
        elif callable(target) and not isinstance(target, type):
            action = FunctionAction(target, **entry)
        else:
            raise TypeError(f"{field}.action names {target!r}: neither an Action subclass "
                            "nor a function.")
        for key, value in schedule.items():
            setattr(action, key, value)
        if not isinstance(action.every, int) or action.every < 0:
            raise ValueError(f"{field}.every={action.every!r} must be an integer >= 0 "
                             "(0: only at the end of training).")
        actions.append(action)
    return actions


def every(step, interval):
    """True at multiples of `interval`; an interval of 0 never fires."""
    return interval > 0 and step % interval == 0
