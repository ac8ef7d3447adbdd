"""The host loop: compiled chunks of train steps, actions at their boundaries, stopping.

    while not done:
        trainer.train_loop(iterator, steps to the next step where an action is due)
        check for divergence; agree with every worker on a signal or the time budget
        run the due actions (log, checkpoint, evaluate, best checkpoint, the user's)

Every worker runs the same loop and calls its actions at the same steps, so an
action may hold collectives; decisions that one process takes alone (a signal,
its clock, a stop requested by an action) are agreed on by all-reducing a flag.
"""

import signal
import time

import tensorflow as tf
from absl import logging

from trainer.loop.action import every
from trainer.runtime import startup
from trainer.loop.divergence import check_finite
from trainer.loop.goodput import Ledger, launch_start
from trainer.loop.run_summary import write_start, write_summary
from trainer.loop.signals import DiskFull, Preempted, StopOnSignal, disk_full_path
from trainer.runtime.summaries import Summaries
from trainer.state.checkpoint_state import latest_checkpoint
from trainer.state.workdir import ChiefFiles


class Controller:
    """Runs `trainer` to `trainer.train_steps`, calling `actions` (trainer/loop/action.py)
    at their steps; it builds none of them (the modes do, a training run's in the order
    of `trainer.actions.train_actions`)."""

    def __init__(self, trainer, actions):
        self.trainer = trainer
        self.summaries = Summaries(trainer.workdir, trainer.is_chief)
        self.files = ChiefFiles(trainer.is_chief)  # what actions write besides summaries
        self.ledger = Ledger(trainer.workdir, trainer.is_chief)  # where the time went
        self.actions = list(actions)
        self.max_seconds = trainer.config.trainer.max_seconds
        self.step = self.start_step = int(trainer.step.numpy())
        # This process's wall time: in the compiled train loop, and in actions by kind.
        self.seconds = {"train": 0.0, "input_wait": 0.0, "eval": 0.0, "checkpoint": 0.0,
                        "other": 0.0}
        self.clock = time.monotonic  # (a test's fake clock)
        # For the time budget: the longest a step has taken (a chunk that traced only
        # until another chunk ran) and the longest each action has taken.
        self._step_seconds, self._action_seconds = None, {}
        self._traced_loop, self._traced = None, False  # a new train_loop traces
        self.stop_reason = None   # set by `request_stop`, once every worker agrees
        self.interrupted = None   # a signal or the time budget: stop, save, resume later
        self.last_eval = self.last_train = None  # the latest eval/train metrics logged
        self._requested = None
        self._signalled = False
        self.startup = {}  # {phase: seconds} from the launch to the loop (startup.py)

    @property
    def is_chief(self):
        """The one process that writes the workdir."""
        return self.trainer.is_chief

    @property
    def train_seconds(self):
        return self.seconds["train"]

    @property
    def done(self):
        """Training is over: `train_steps` reached, or an action requested the stop."""
        return self.step >= self.trainer.train_steps or self.stop_reason is not None

    def request_stop(self, reason):
        """Ends training at this step (a checkpoint is written, `train` returns). Any
        worker may ask; all of them stop at the same step."""
        self._requested = reason

    def any_worker(self, flag):
        """True on every worker if `flag` is True on any."""
        return self._any_workers([flag])[0]

    def train(self):
        """Trains from wherever the workdir left off; returns the last eval results.

        SIGTERM/SIGINT: the current chunk of at most `steps_per_loop` steps
        finishes, a checkpoint is written and `Preempted` is raised. The time
        budget (`trainer.max_seconds`) stops the same way but returns.
        """
        trainer = self.trainer
        launched = launch_start(trainer.created)  # the process's start, for its first launch
        # The time budget counts from there, as a scheduler's limit does.
        self.started = self.clock() - max(0.0, time.time() - launched)
        restoring = self.clock()
        trainer.checkpoints.prepare_for_writes()  # a damaged state file, cut-short writes
        trainer.restore_or_warm_start()
        restore_seconds = self.clock() - restoring
        startup.mark("restore")
        self.step = self.start_step = int(trainer.step.numpy())
        iterator = iter(trainer.distributed_dataset("train"))  # bad data fails before any write
        startup.mark("data")
        for action in self.actions:
            action.begin(self)
        write_start(self)
        self._agree_on_requests()
        self.startup = startup.take(launched)
        logging.info("%.1f s from the launch to the loop: %s.", sum(self.startup.values()),
                     startup.describe(self.startup))
        self.ledger.start(launched, self.step, restore_seconds, self.seconds, self.startup)
        self.loop_started = self.clock()
        # From here on, a run ends with summary.json (before: a failure leaves the
        # previous run's summary as it was).
        with StopOnSignal() as stop:
            try:
                if self.done:
                    logging.info("Nothing to train at step %d: %s.", self.step,
                                 self.stop_reason or f"train_steps={trainer.train_steps} reached")
                    self._run_actions()  # evaluate at the end, as an uninterrupted run would
                    self.ledger.cycle(self.step, 0, self.seconds)
                while not self.done:
                    first_step = self.step
                    self._train_chunk(iterator)
                    self.interrupted = self._interruption(stop)
                    self._run_actions()
                    self.ledger.cycle(self.step, self.step - first_step, self.seconds,
                                      self._traced)
                    if self.interrupted:
                        break
                trainer.checkpoints.sync()  # the run ends with its last checkpoint complete
            except Exception as error:  # divergence, a failed worker, a bug: still summed up
                failure = (self._disk_full(error) if disk_full_path(error) is not None
                           else self._peer_failure(error) if self.multi_worker
                           and isinstance(error, tf.errors.OpError) else error)
                # A write under way ends before the exit (the failure matters more).
                for finish in (self.summaries.flush, trainer.checkpoints.sync):
                    try:
                        finish()
                    except Exception as finish_error:  # noqa: BLE001
                        logging.error("%s", finish_error)
                try:
                    write_summary(self, f"{type(failure).__name__}: "
                                        f"{str(failure).strip()[:500]}")
                except Exception as summary_error:  # noqa: BLE001  (the failure matters more)
                    logging.error("summary.json not written: %s", summary_error)
                if failure is error:
                    raise
                raise failure from error
            finally:
                for action in self.actions:
                    action.end(self)
        self.summaries.flush()
        write_summary(self, self.interrupted or self.stop_reason)
        if self._signalled:
            raise Preempted(f"Stopped by {stop.name} at step {self.step}; checkpoint saved in "
                            f"{trainer.checkpoints.directory}. Relaunch with the same "
                            "--workdir to continue from this step.", stop.signum or signal.SIGTERM)
        return self.last_eval

    def _disk_full(self, error):
        """The DiskFull error that says what to do (a failed checkpoint write removes what
        it had written: the space the summary needs)."""
        latest = latest_checkpoint(self.trainer.checkpoints.directory)
        return DiskFull(
            f"No space left on device writing {disk_full_path(error) or self.trainer.workdir}. "
            f"The last complete checkpoint is {latest or 'none (no checkpoint was written)'}"
            "; nothing before it is lost. Free space on that filesystem (or move the workdir "
            "to a larger one) and relaunch with the same --workdir to continue from it.")

    # ----------------------------------------------------------------- inside

    def _chunk_steps(self, step):
        """The steps from `step` to the next boundary: where an action is due, at most
        `steps_per_loop`."""
        intervals = [self.trainer.config.trainer.steps_per_loop] + [
            a.every for a in self.actions if a.every > 0]
        return min([k - step % k for k in intervals]
                   + [b - step for a in self.actions for b in a.boundaries() if b > step]
                   + [self.trainer.train_steps - step])

    def _train_chunk(self, iterator):
        """Runs the compiled loop to the next step where an action is due."""
        num_steps = self._chunk_steps(self.step)
        replace_estimate = self._step_seconds is None or self._traced  # the last one traced
        # The first chunk traces the loop, and so does the first after `use_jit` switched.
        self._traced = self.trainer.train_loop is not self._traced_loop
        self._traced_loop = self.trainer.train_loop
        start = self.clock()
        # A profiler step for TensorBoard's Profile tab (a no-op unless profiling).
        first_step = self.step + 1
        with tf.profiler.experimental.Trace("train", step_num=first_step, _r=1):
            out = self.trainer.train_loop(iterator, tf.constant(num_steps, tf.int64))
            self.step = int(self.trainer.step.numpy())  # waits for the loop to finish
        seconds = self.clock() - start
        self.seconds["train"] += seconds  # input_wait included
        self.seconds["input_wait"] += float(out["input_wait"])
        per_step = seconds / max(self.step - first_step + 1, 1)
        self._step_seconds = (per_step if replace_estimate
                              else max(self._step_seconds, per_step))
        if "per_step" in out:
            self.summaries.per_step("train", self.trainer.PER_STEP_SCALARS, out["per_step"],
                                    first_step)
        check_finite(self.trainer, self.step)

    def _interruption(self, stop):
        """Why to stop and resume later, agreed by every worker: a signal, or the time
        budget, which the next chunk, the actions due after it and a final save could
        overrun, each as slow as its slowest so far (so the last save is not cut off
        by a scheduler's limit)."""
        elapsed = self.clock() - self.started
        over_time = bool(self.max_seconds) and (
            elapsed + self._next_cycle_seconds() > self.max_seconds)
        signalled, over_time = self._any_workers([stop.signum is not None, over_time])
        self._signalled = signalled
        if signalled:
            return f"stopped by {stop.name}"
        if over_time:
            return (f"time budget: trainer.max_seconds={self.max_seconds} would be exceeded "
                    f"by another chunk after {elapsed:.0f} s; relaunch with the same --workdir "
                    "to continue")
        return None

    def _next_cycle_seconds(self):
        """The longest the actions due now, the next chunk and the actions due after it
        (at least a save) may take, from the longest each took so far; an action that
        has not run yet counts 0. (An asynchronous save counts its blocking part: its
        background write, which the end of the run waits for, is not foreseen.)"""
        steps = self._chunk_steps(self.step) if not self.done else 0
        end = self.step + steps

        def due(step, save):
            return [i for i, a in enumerate(self.actions)
                    if every(step, a.every) or step in a.boundaries()
                    or (a.at_end and step >= self.trainer.train_steps)
                    or (save and a.on_interrupt and a.kind == "checkpoint")]  # a stop's save

        return (steps * (self._step_seconds or 0.0)
                + sum(self._action_seconds.get(i, 0.0)
                      for i in due(self.step, False) + (due(end, True) if steps else [])))

    def _run_actions(self):
        """Calls every due action once; a stop requested on the way makes the at-end
        actions due, so they run in a second pass (e.g. the final checkpoint)."""
        logs, ran = {}, set()
        while True:
            done = self.done
            for i, action in enumerate(self.actions):
                if (i in ran or (action.chief_only and not self.is_chief)
                        or (self.interrupted and not action.on_interrupt)):
                    continue
                if action.should_run(self, self.step, logs):
                    start = self.clock()
                    action(self, self.step, logs)
                    seconds = self.clock() - start
                    self.seconds[action.kind] = self.seconds.get(action.kind, 0.0) + seconds
                    self._action_seconds[i] = max(self._action_seconds.get(i, 0.0), seconds)
                    ran.add(i)
            self._agree_on_requests()
            if self.done == done:
                train = {k[6:]: v for k, v in logs.items() if k.startswith("train/")}
                self.last_train = train or self.last_train
                return logs

    def _agree_on_requests(self):
        if self.stop_reason is None and self.any_worker(self._requested is not None):
            self.stop_reason = self._requested or "stop requested on another worker"
            logging.info("Stopping at step %d: %s.", self.step, self.stop_reason)

    @property
    def multi_worker(self):
        return isinstance(self.trainer.strategy, tf.distribute.MultiWorkerMirroredStrategy)

    def _any_workers(self, flags):
        if not self.multi_worker:
            return [bool(f) for f in flags]
        counts = self._sum_over_workers(tf.constant([int(bool(f)) for f in flags]))
        return [bool(c) for c in counts.numpy()]

    @tf.function
    def _sum_over_workers(self, value):
        strategy = self.trainer.strategy
        per_replica = strategy.run(tf.identity, args=(value,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _peer_failure(self, error):
        return RuntimeError(
            f"A peer worker failed or became unreachable near step "
            f"{int(self.trainer.step.numpy())} ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[0][:200]}). Relaunch every worker with the "
            "same --workdir: training resumes from "
            f"{self.trainer.checkpoints.latest}.")
