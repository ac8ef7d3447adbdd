"""Vision Transformer on CIFAR-10 (4x4 patches), same data pipeline as the CNN.

python launch.py --config=configs/vit_cifar.py --workdir=runs/vit
"""

import ml_collections

from configs import cifar


def get_config():
    c = cifar.get_config()
    c.model = ml_collections.ConfigDict(dict(
        name="vit", patch_size=4, num_layers=4, d_model=128, num_heads=4, mlp_dim=256,
        dropout=0.0, pool="gap", remat=False))  # pool: cls | gap
    c.data.update(global_batch_size=256, augment=True, normalization="standardize")
    c.optimizer.update(name="adamw", learning_rate=1e-3, schedule="cosine", warmup_steps=100,
                       weight_decay=0.05, clip_norm=1.0)
    c.trainer.train_steps = 10 * cifar.TRAIN_EXAMPLES // 256
    return c
