"""Every field the framework reads, each commented once: the base of every config.

A config states only what differs from it (configs/cifar.py, configs/lm.py, yours):

    from configs import base

    def get_config():
        c = base.get_config()
        c.task.name = "my_task"
        c.model = ml_collections.ConfigDict(dict(width=64))  # the task's own fields
        c.data.global_batch_size = 256
        return c

The task's own fields live in `model` and `data` (beside data.global_batch_size);
a missing field is an error where the framework reads it, never a silent default.
"""

import ml_collections

# What AdamW does not decay: biases, normalization scales and offsets (Keras names them
# gamma and beta), embeddings.
WEIGHT_DECAY_EXCLUDE = (r".*/bias", r".*/(gamma|beta)", r".*/embeddings")


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.precision = "auto"  # float32 | mixed_float16 | mixed_bfloat16 | auto
    # Regexes over layer paths (keras Layer.path, e.g. ".*layer_normalization.*"): matching
    # layers compute in float32 under a mixed policy; the start of a run logs every layer's.
    c.precision_overrides = ml_collections.ConfigDict(dict(float32_layers=()))
    # every: gradient telemetry every N steps (numerics/ in TensorBoard, numerics.json at
    # the end; 0: off, nothing added to the step). check_steps: --mode=precision_check.
    c.numerics = ml_collections.ConfigDict(dict(every=0, check_steps=20))
    # --mode=find_lr: `steps` steps with the learning rate growing exponentially from
    # min_lr to max_lr, stopped once the smoothed loss passes `diverge` times its minimum.
    c.find_lr = ml_collections.ConfigDict(dict(min_lr=1e-7, max_lr=10.0, steps=100,
                                               diverge=4.0))
    # --mode=find_batch_size: doubling from `start` (0: data.global_batch_size), then a
    # binary search over multiples of `multiple_of`; a trial runs `steps_per_trial` steps
    # and fails out of memory or past memory_budget_gb of allocator peak (a CPU's: the
    # process's peak memory growth; 0: none on a GPU or TPU; on a CPU, which has no
    # out-of-memory error, half the memory available).
    c.find_batch_size = ml_collections.ConfigDict(dict(
        start=0, max_trials=12, steps_per_trial=2, multiple_of=8, memory_budget_gb=0.0))

    # name: a registered Task (built in: images, lm). module: a Task module of your own to
    # import first (it registers `name`), e.g. "my_task" for a my_task.py next to your
    # config file.
    c.task = ml_collections.ConfigDict(dict(name="", module=""))
    c.model = ml_collections.ConfigDict()  # the task's fields
    # The task's fields, and the batch the framework splits over replicas and
    # accumulation micro-steps.
    c.data = ml_collections.ConfigDict(dict(global_batch_size=128))

    c.optimizer = ml_collections.ConfigDict(dict(
        name="adam",               # adam | adamw | sgd
        learning_rate=1e-3,
        schedule="constant",       # constant | cosine (linear warmup, then cosine to 0)
        warmup_steps=0,
        clip_norm=0.0,             # > 0: clip by the global norm of the reduced gradients
        ema_decay=0.0,             # > 0 (e.g. 0.999): keep an EMA of the weights (eval.use_ema)
        weight_decay=1e-4,         # adamw only
        # adamw: variables not decayed (regexes over variable names,
        # docs/checkpoints.md#variable-names)
        weight_decay_exclude=WEIGHT_DECAY_EXCLUDE,
        freeze=(),                 # regexes over variable names: no updates, no slots
        momentum=0.9, nesterov=True))  # sgd only

    c.init = init_config()

    c.loss_scale = ml_collections.ConfigDict(dict(
        dynamic=True, initial_scale=2.0**15, growth_steps=2000))  # mixed_float16 only

    c.distribution = ml_collections.ConfigDict(dict(
        strategy="auto",           # auto | default | one_device | mirrored | multi_worker | tpu
        tpu="",                    # TPU name or grpc:// address
        # multi_worker: where the cluster comes from: tf_config (the TF_CONFIG variable;
        # --local_workers=N writes it) or slurm (srun's environment; worker ports from
        # port_base, one per task on a node)
        cluster="tf_config", port_base=8888,
        # the gradients' all-reduce: auto | ring | nccl (multi_worker's implementation),
        # bytes_per_pack (0: one pack), all_reduce_dtype float32 | bfloat16 (half the bytes
        # moved, a coarser sum; the update stays float32). docs/multi_worker.md#the-all-reduce.
        all_reduce="auto", bytes_per_pack=0, all_reduce_dtype="float32",
        collective_timeout_seconds=600))  # multi_worker: a peer silent this long is an error

    # Intervals count steps. steps_per_loop >= 1 (steps per compiled host call); for
    # eval_every, checkpoint_every and log_every, 0 means never except at the end of
    # training (the last step always logs, checkpoints and, in train_and_eval, evaluates).
    c.trainer = ml_collections.ConfigDict(dict(
        train_steps=1000,
        steps_per_loop=50,
        # k > 1: each optimizer step averages the gradients of k micro-batches of
        # data.global_batch_size (an effective batch of k times it); steps count
        # optimizer steps.
        accumulation_steps=1,
        per_step_summaries=True,   # every step's loss, lr, loss scale, grad norm in train/
        eval_every=500,
        checkpoint_every=500,
        max_to_keep=3,
        # Saves block only to copy the values to host memory; a thread writes the files.
        # on | off | auto: on for one process on CPU/GPU, off on TPU and multi-worker.
        async_checkpoint="auto",
        max_nonfinite_steps=0,     # non-finite steps in a row that stop the run;
                                   # 0: 100 with float16 loss scaling, else 1
        # A run stopped for divergence replays its steps from the last good checkpoint (or
        # an in-memory copy of step 0), names the layer that went non-finite and the fix,
        # in workdir/diagnosis.json and the last log line, within this many seconds
        # (docs/precision.md#when-a-run-diverges).
        diagnose=True, diagnose_max_seconds=600.0,
        # "eager": the steps run eagerly on one replica (pdb, print, Python exceptions in
        # a Task or a model; slow); "dump": TensorFlow Debugger V2 data of the steps
        # debug_steps=(first, last) in workdir/debug/ (docs/precision.md#debug-modes).
        debug="", debug_steps=(1, 3),
        # > 0: every this many steps, and before every save and evaluation, check that all
        # replicas (on every worker) hold the same variables; stop if not
        # (docs/multi_worker.md#workers-that-drift-apart)
        consistency_every=0,
        log_every=50,
        deterministic=False,       # True: deterministic ops, so a resumed run is bitwise exact
        # on | off | auto: XLA for the forward and backward pass; auto times both on the
        # first launch where it can pay (on a CPU, only a run its first chunk shows to be
        # long) and keeps the faster (trainer/actions/jit_choice.py); TPUs always compile.
        jit_compile="auto",
        # After each eval, the best checkpoint by this eval metric is kept in workdir/best/
        # ("": none); early_stop_patience > 0 evals without improvement end the run.
        best_metric="eval/loss", best_mode="min", early_stop_patience=0,
        max_seconds=0.0,  # > 0: stop with a checkpoint this long after process start (0: no limit)
        # > 0: peak TFLOP/s of one device, for MFU where trainer/step/flops.py has no figure
        # (0: its table for GPUs/TPUs, a measured matmul on a CPU)
        peak_tflops=0.0,
        profile_steps=()))         # (first, last): a profiler trace of those steps, in train/

    # timeout_seconds: --mode=continuous_eval exits after this long without a new checkpoint.
    # use_ema: with optimizer.ema_decay > 0, evaluation, the best checkpoint and export use
    # the EMA weights (training goes on with the raw ones).
    c.eval = ml_collections.ConfigDict(dict(timeout_seconds=3600, use_ema=True))

    # Your own actions at loop boundaries, by name: dict(action="my_actions.PrintLoss",
    # every=100, **keyword arguments of the class or function);
    # docs/add_an_action.md#name-it-in-the-config.
    c.actions = ml_collections.ConfigDict()

    # SavedModel for serving in workdir/export/<step>/, by --mode=export or (enabled) at
    # the end of training. checkpoint: "" is the best one if trainer.best_metric is set,
    # else the latest. compute_dtype: float32, or "training" to serve in the mixed policy.
    c.export = ml_collections.ConfigDict(dict(enabled=False, checkpoint="",
                                              compute_dtype="float32"))
    return c


def init_config():
    """Warm start (fine-tuning), applied at step 0 only, never over a resume.

    checkpoint: a run's workdir or checkpoint (ckpt-N), a Keras .weights.h5 or .keras
    file (weights only, read into this task's model); "" starts from the initializers.
    keras_architecture: a .keras file builds its own architecture (Keras' safe mode),
    for another model's weights with `rename`. Only for a file you trust: its config
    can name code to import.
    include / exclude: regexes over this model's variable names (whole names).
    rename: ((regex, replacement), ...) applied in turn (re.sub) to the source's names.
    A source whose variables all sit under another model name (a language model's
    `lm/...` read into a classifier's `classifier/...`) is read under this model's,
    unless rename is given.
    new: regexes over this model's variables the source may lack (a new head): loaded
    if it holds them in the same shape, else left at their initial values, as the
    table says, strict or not.
    strict: an included variable the source lacks, or holds in another shape, is an
    error (False: it keeps its initial value, and the table says so).
    use_ema: a source run that keeps an EMA of its weights (optimizer.ema_decay) gives
    its averages, the weights it evaluated, kept as best and exported (False: its raw
    weights). The init table and init.json say which.
    """
    return ml_collections.ConfigDict(dict(checkpoint="", include=(".*",), exclude=(),
                                          rename=(), new=(), strict=True, use_ema=True,
                                          keras_architecture=False))
