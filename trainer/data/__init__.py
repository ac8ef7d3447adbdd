"""The data layer: what a task reads and in which order. A task of your own imports
the step-indexed order (`trainer.data.order`) and the sources from here."""
