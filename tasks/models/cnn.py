"""Convolutional image classifiers: the mixed-precision tutorial's CNN and a small ResNet."""

import keras


def seed_cnn(m=None, num_classes=10, image_size=32):
    """Exactly the CNN of the TensorFlow mixed-precision tutorial."""
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(num_classes, dtype="float32"),  # float32 logits feed the loss
    ], name="seed_cnn")


def resnet(m, num_classes=10, image_size=32):
    """ResNet-20 style (He et al. 2016, CIFAR variant): 3 stages of `m.blocks_per_stage`
    basic blocks, widths m.width*(1, 2, 4). ~91% on CIFAR-10 with SGD+momentum, cosine LR,
    180 epochs."""
    width, blocks_per_stage, weight_decay = m.width, m.blocks_per_stage, m.weight_decay
    reg = keras.regularizers.L2(weight_decay / 2)  # gradient of wd/2*|w|^2 is wd*w

    def conv(filters, strides=1, kernel=3):
        return keras.layers.Conv2D(filters, kernel, strides, padding="same", use_bias=False,
                                   kernel_initializer="he_normal", kernel_regularizer=reg)

    def block(x, filters, strides):
        shortcut = x
        y = conv(filters, strides)(x)
        y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
        y = keras.layers.BatchNormalization()(conv(filters)(y))
        if strides != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.BatchNormalization()(conv(filters, strides, 1)(shortcut))
        return keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))

    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(conv(width)(inputs)))
    for stage in range(3):
        for i in range(blocks_per_stage):
            x = block(x, width * 2**stage, 2 if (stage and i == 0) else 1)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", kernel_regularizer=reg)(x)
    return keras.Model(inputs, outputs, name="resnet")
