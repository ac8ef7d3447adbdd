"""python launch.py --config=configs/cifar.py --workdir=runs/cifar

The same as the installed `tftrainer` command; the flags and modes are in trainer/cli.py.
"""

from trainer.cli import entry

if __name__ == "__main__":
    entry()
