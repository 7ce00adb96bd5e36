#!/usr/bin/env python3
"""The standard tf.data input pipeline, unchanged, pointed at a directory: per epoch, how fast
it delivers samples and a checksum of everything it read.

    tf.data.Dataset.list_files(DIR/*/*.JPEG)           # shuffled afresh every epoch
      .map(read_file -> decode_jpeg -> random crop -> resize 224x224, num_parallel_calls=N)
      .batch(B).prefetch(AUTOTUNE)

The map also hashes each sample in the graph: tf.fingerprint (farmhash64) of the path
relative to DIR, a NUL and the file's contents, so no Python runs per sample. --mode bytes
stops after read_file and the hash (fetch-bound); --mode decode decodes, crops a random
region of 8%-100% of the area with aspect 3/4-4/3 (what RandomResizedCrop and the Inception
preprocessing do) and resizes it to 224x224 (prep-bound). trainlib.py explains the checksum;
its value differs from train-input.py's (another hash), but for one dataset it is the same
through a mount as from the source.

Prints one line per epoch (--json: one object). list_files globs the class folders without
opening a file, so every file open during an epoch is a sample. Run it with
.venv/bin/python (scripts/setup-python.sh).

    .venv/bin/python scripts/train-input-tf.py --epochs 3 /mnt/train
    .venv/bin/python scripts/train-input-tf.py --mode decode --workers 0 --json /mnt/train
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
import tensorflow as tf  # noqa: E402

import trainlib  # noqa: E402

WHOLE_IMAGE = tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4])


def sample_fn(root, decode):
    prefix_len = len(os.path.join(root, "").encode())

    def load(path):
        contents = tf.io.read_file(path)
        relative = tf.strings.substr(path, prefix_len, -1)
        key = tf.strings.join([relative, contents], separator="\0")
        digest = tf.bitcast(tf.fingerprint(tf.reshape(key, [1]))[0], tf.int64)
        size = tf.strings.length(contents, unit="BYTE")
        if not decode:
            return digest, size
        image = tf.io.decode_jpeg(contents, channels=3)
        begin, extent, _ = tf.image.sample_distorted_bounding_box(
            tf.shape(image), WHOLE_IMAGE, min_object_covered=0.08, aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
        image = tf.image.resize(tf.slice(image, begin, extent), [224, 224]) / 255.0
        return digest, size, image

    return load


def main():
    args = trainlib.arguments(__doc__, "parallel map calls (num_parallel_calls); 0 for tf.data.AUTOTUNE [2]")
    tf.random.set_seed(args.seed)
    root = os.path.abspath(args.dir)
    files = tf.data.Dataset.list_files(os.path.join(root, "*", "*.JPEG"), shuffle=True, seed=args.seed)
    parallel = args.workers or tf.data.AUTOTUNE
    dataset = (files.map(sample_fn(root, args.mode == "decode"), num_parallel_calls=parallel)
               .batch(args.batch_size)
               .prefetch(tf.data.AUTOTUNE))
    trainlib.run_epochs(args, "tensorflow", lambda: ((batch[0].numpy(), batch[1].numpy()) for batch in dataset))


if __name__ == "__main__":
    main()
