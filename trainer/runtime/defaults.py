"""Defaults that config files and the Trainer share: plain values in the bottom layer,
so that a config file names them without reaching into the step's modules."""

# What AdamW does not decay unless optimizer.weight_decay_exclude says otherwise: biases,
# normalization scales and offsets (Keras names them gamma and beta), embeddings.
WEIGHT_DECAY_EXCLUDE = (r".*/bias", r".*/(gamma|beta)", r".*/embeddings")
