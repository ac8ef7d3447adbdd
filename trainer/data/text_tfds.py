"""A prepared TFDS text dataset read whole into memory (never downloaded here):
`data.tfds_name`, its splits `data.train` and `data.eval`, and the features
`data.text_key` and `data.label_key` (a ClassLabel's names become the label names)."""

import os


def read_tfds(data):
    """(train records, eval records, label names or None) as labeled_text reads them."""
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError("data.format=tfds needs tensorflow-datasets: pip install "
                          "'tftrainer[data]'.") from e
    if not data.tfds_name:
        raise ValueError("data.format=tfds needs --config.data.tfds_name=.")
    builder = tfds.builder(data.tfds_name,
                           data_dir=os.path.expanduser(data.tfds_data_dir) or None)
    if not builder.is_prepared():
        raise ValueError(f"TFDS dataset {data.tfds_name} is not prepared in "
                         f"{builder.data_dir}: prepare it first (tfds build, or "
                         "builder.download_and_prepare()) and set data.tfds_data_dir.")
    features = builder.info.features
    missing = [k for k in (data.text_key, data.label_key) if k not in features]
    if missing:
        raise ValueError(f"{data.tfds_name} has no feature {missing} (it has "
                         f"{sorted(features)}); set data.text_key and data.label_key.")
    if not data.eval:
        raise ValueError("data.format=tfds: name the held-out split with --config.data.eval "
                         f"(e.g. test; {data.tfds_name} has {sorted(builder.info.splits)}).")
    splits = [data.train, data.eval]
    for split in splits:
        if split not in builder.info.splits:
            raise ValueError(f"{data.tfds_name} has no split {split!r} (data.train and "
                             f"data.eval name splits); it has {sorted(builder.info.splits)}.")
    label = features[data.label_key]
    names = list(label.names) if hasattr(label, "names") else None

    def records(split):
        rows = tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))
        return [(bytes(r[data.text_key]),
                 names[int(r[data.label_key])] if names else int(r[data.label_key]),
                 f"{data.tfds_name}[{split}] example {i}") for i, r in enumerate(rows)]

    return records(data.train), records(data.eval), names
