"""A TFDS dataset prepared beforehand: opened, never downloaded here."""

import os


def prepared_builder(data):
    """(tensorflow_datasets, the builder of data.tfds_name in data.tfds_data_dir), or an
    error saying how to install TFDS or prepare the dataset."""
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
    return tfds, builder
