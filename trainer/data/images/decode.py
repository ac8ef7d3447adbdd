"""Encoded image files to uint8 batches: checked, decoded, resized, 3 channels.

A replica batch is decoded in one map call (`tf.map_fn` over its images) rather than
one tf.data element per image: on 2 cores that reads 32x32 PNGs about 2.3x faster,
because tf.data's per-element overhead is larger than the decode of a small image.
"""

import struct
import zlib

import tensorflow as tf

# The bytes that open a file of each format: a file that is empty, text or of another
# kind fails this check and is named at once. (A truncated or corrupt image passes it
# and fails in the decoder; the task then finds and names it:
# ImageClassificationTask.explain_input_error. Bytes after an image's end are common and harmless, so the end
# is not checked.)
_HEADS = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")
PARALLEL_DECODES = 16  # images of one batch decoded at once (map_fn parallel_iterations)
_HEADER_PAD = b"\0" * 26  # the header bytes `declared_pixels` reads (BMP's reach furthest)


def _png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data))


# A black 1x1 PNG decoded in place of a file that failed the check (the batch then
# fails its assertion): the decoder never sees it.
_BLANK_PNG = (_HEADS[0] + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
              + _png_chunk(b"IDAT", zlib.compress(b"\0\0\0\0")) + _png_chunk(b"IEND", b""))


def looks_like_image(encoded):
    """True where bytes start as a PNG, JPEG, GIF or BMP file (any shape of strings in,
    the same shape of booleans out)."""
    found = tf.fill(tf.shape(encoded), False)
    for head in _HEADS:
        found |= tf.strings.substr(encoded, 0, len(head)) == head
    return found


def declared_pixels(encoded):
    """int64 [B]: the pixels that each of encoded images [B] declares in its header (0
    for bytes of no known format), read before any decode: an image's size is unknown
    until then, and a file of a few kB can declare 10^10 pixels."""
    padded = tf.strings.substr(tf.strings.join([encoded, _HEADER_PAD]), 0, len(_HEADER_PAD))
    b = tf.cast(tf.io.decode_raw(padded, tf.uint8), tf.int64)

    def number(start, size, big_endian):
        order = range(size) if big_endian else reversed(range(size))
        value = tf.zeros_like(b[:, 0])
        for i in order:
            value = value * 256 + b[:, start + i]
        return value

    def area(width, height):  # (each side at most 2^31: the product fits in int64)
        return tf.minimum(width, 2**31) * tf.minimum(height, 2**31)

    png = area(number(16, 4, True), number(20, 4, True))              # IHDR width, height
    gif = area(number(6, 2, False), number(8, 2, False))              # logical screen
    height = number(22, 4, False)                                     # signed: < 0 top-down
    bmp = tf.where(number(14, 4, False) == 12,                        # OS/2 1.x header
                   area(number(18, 2, False), number(20, 2, False)),
                   area(number(18, 4, False),
                        tf.where(height >= 2**31, 2**32 - height, height)))
    kind = [tf.strings.substr(encoded, 0, len(h)) == h for h in _HEADS]
    jpeg = tf.cond(tf.reduce_any(kind[1]), lambda: tf.map_fn(
        lambda e: tf.cond(tf.strings.substr(e, 0, 3) == _HEADS[1],
                          lambda: tf.reduce_prod(tf.image.extract_jpeg_shape(e, tf.int64)[:2]),
                          lambda: tf.constant(0, tf.int64)),
        encoded, fn_output_signature=tf.int64), lambda: tf.zeros_like(png))
    return tf.where(kind[0], png, tf.where(kind[1], jpeg, tf.where(
        kind[2] | kind[3], gif, tf.where(kind[4], bmp, tf.zeros_like(png)))))


def decode(encoded, image_size):
    """uint8 [image_size, image_size, 3] of one encoded image of any size, grayscale,
    RGB, RGBA or palette (GIF: its first frame); resized only if its size differs (a
    third of the cost of a small image)."""
    x = tf.io.decode_image(encoded, channels=3, expand_animations=False)

    def resized():
        x_ = tf.image.resize(x, [image_size, image_size])
        return tf.cast(tf.clip_by_value(tf.round(x_), 0, 255), tf.uint8)

    same = tf.reduce_all(tf.shape(x)[:2] == image_size)
    return tf.ensure_shape(tf.cond(same, lambda: x, resized), [image_size, image_size, 3])


def decode_batch(encoded, image_size, max_pixels):
    """(uint8 [B, image_size, image_size, 3], readable [B], pixels [B]) of encoded images
    [B]: a black image where the bytes are not an image or declare more than
    `max_pixels` pixels (`pixels`, from the header), which are never decoded."""
    pixels = declared_pixels(encoded)
    readable = looks_like_image(encoded) & (pixels <= max_pixels)
    images = tf.map_fn(lambda e: decode(e, image_size), tf.where(readable, encoded, _BLANK_PNG),
                       fn_output_signature=tf.TensorSpec([image_size, image_size, 3],
                                                         tf.uint8),
                       parallel_iterations=PARALLEL_DECODES)
    return images, readable, pixels


def read_files(paths):
    """The bytes of each file of a batch of paths."""
    return tf.map_fn(tf.io.read_file, paths, parallel_iterations=PARALLEL_DECODES)


def checked(images, readable, pixels, max_pixels, labels, names, num_classes):
    """The batch, after asserting every image was readable (`decode_batch`) and every
    label in range: an error naming the files otherwise."""
    oversized = pixels > max_pixels
    unreadable = tf.debugging.Assert(tf.reduce_all(readable | oversized), [
        "File(s) that are not PNG, JPEG, GIF or BMP images (empty, or another format): "
        "remove or fix them, or set --config.data.skip_bad=True to leave them out:",
        tf.boolean_mask(names, ~readable & ~oversized)], summarize=20)
    too_large = tf.debugging.Assert(~tf.reduce_any(oversized), [
        f"Image file(s) that declare more than data.max_image_pixels={max_pixels} pixels "
        "(decoding holds 16 images at once in memory, as float32 to resize): shrink or "
        "remove them, raise the limit, or set --config.data.skip_bad=True to leave them "
        "out:", tf.boolean_mask(names, oversized), "pixels:",
        tf.boolean_mask(pixels, oversized)], summarize=20)
    outside = (labels < 0) | (labels >= num_classes)
    out_of_range = tf.debugging.Assert(~tf.reduce_any(outside), [
        f"Labels outside [0, {num_classes}) (data.num_classes) in:",
        tf.boolean_mask(names, outside), "labels:", tf.boolean_mask(labels, outside)],
        summarize=20)
    with tf.control_dependencies([unreadable, too_large, out_of_range]):
        return tf.identity(images), tf.identity(labels)
