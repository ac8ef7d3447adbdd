"""A prepared TFDS text dataset read whole into memory (never downloaded here):
`data.tfds_name`, its splits `data.train` and `data.eval`, and the features
`data.text_key` and `data.label_key` (a ClassLabel's names become the label names)."""

from trainer.data.tfds_prepared import prepared_builder


def read_tfds(data):
    """(train records, eval records, label names or None) as labeled_text reads them."""
    tfds, builder = prepared_builder(data)
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
