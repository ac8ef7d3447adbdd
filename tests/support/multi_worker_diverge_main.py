"""One worker of the multi-worker divergence test: the made-to-fail float16 Dense under
MultiWorkerMirroredStrategy; writes the error each worker ends with.

Usage (TF_CONFIG set by the test):
    python tests/support/multi_worker_diverge_main.py WORKDIR OUT.txt
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))  # the repository

import keras  # noqa: E402

from support.made_to_fail import MadeToFail, made_to_fail_config  # noqa: E402
from trainer import Trainer  # noqa: E402
from trainer.runtime.distribute import build_strategy  # noqa: E402
from trainer.runtime.precision import set_policy  # noqa: E402


def main(workdir, out):
    config = made_to_fail_config("overflow_dense", **{
        "distribution.strategy": "multi_worker",
        "distribution.collective_timeout_seconds": 60})
    strategy = build_strategy(config.distribution)
    keras.utils.set_random_seed(config.seed)
    set_policy(config.precision, strategy)
    trainer = Trainer(config, MadeToFail(config, "overflow_dense"), strategy, workdir)
    try:
        trainer.train(evaluate=False)
        message = "no divergence"
    except FloatingPointError as error:
        message = str(error)
    with open(out, "w") as f:
        f.write(message)


if __name__ == "__main__":
    main(*sys.argv[1:])
