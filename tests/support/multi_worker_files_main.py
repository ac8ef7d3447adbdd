"""One worker of the file-input multi-worker test: trains the images task on a digits
folder and saves its weights and the first train batches it reads.

Usage (TF_CONFIG set by the test):
    python tests/support/multi_worker_files_main.py DATA_DIR WORKDIR OUT.npz
"""

import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # (this is tests/support/)
sys.path.insert(0, os.path.dirname(TESTS))  # the repository
sys.path.insert(0, TESTS)  # support

import keras  # noqa: E402
import numpy as np  # noqa: E402

from trainer.task import get_task  # noqa: E402
from support.image_data import files_config  # noqa: E402
from trainer import Trainer  # noqa: E402
from trainer.runtime.distribute import build_strategy  # noqa: E402
from trainer.runtime.precision import set_policy  # noqa: E402


def main(data_dir, workdir, out):
    c = files_config(dict(format="folder", train=os.path.join(data_dir, "train"),
                          eval=os.path.join(data_dir, "eval")),
                     **{"trainer.train_steps": 10, "distribution.strategy": "multi_worker",
                        "distribution.collective_timeout_seconds": 30})
    strategy = build_strategy(c.distribution)
    keras.utils.set_random_seed(c.seed)
    set_policy(c.precision, strategy)
    trainer = Trainer(c, get_task(c), strategy, workdir)
    trainer.train(evaluate=False)
    read = iter(strategy.distribute_datasets_from_function(
        lambda ctx: trainer.task.build_inputs("train", ctx, 0)))
    batches = [strategy.experimental_local_results(next(read))[0] for _ in range(6)]
    np.savez(out, step=trainer.step.numpy(), images=np.stack([b[0] for b in batches]),
             labels=np.stack([b[1] for b in batches]),
             weights=np.concatenate([w.numpy().ravel() for w in trainer.model.weights]))


if __name__ == "__main__":
    main(*sys.argv[1:])
