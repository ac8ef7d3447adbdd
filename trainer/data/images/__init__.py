"""Image sources (CIFAR-10 arrays, class folders, TFRecord, TFDS), decoding, splits and
preprocessing."""
