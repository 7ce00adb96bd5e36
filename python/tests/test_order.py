"""coorfs.order without a mount: the hint's text, the paths of a dataset, per-epoch orders."""

import os
import tempfile
import unittest
import warnings

import coorfs
import standin

# A plain directory stands in for the mount: hints are written to its order file.
_send_hint = standin.install(coorfs.order)


class FakeImageFolder:
    def __init__(self, paths):
        self.samples = [(p, i % 3) for i, p in enumerate(paths)]

    def __len__(self):
        return len(self.samples)


def order_file(mount):
    with open(os.path.join(mount, coorfs.ORDER_FILE), "rb") as f:
        return f.read()


class SamplePaths(unittest.TestCase):
    def test_known_dataset_shapes(self):
        paths = ["/m/a/1.jpg", "/m/b/2.jpg"]
        self.assertEqual(coorfs.sample_paths(FakeImageFolder(paths)), paths)
        self.assertEqual(coorfs.sample_paths(type("D", (), {"imgs": [(p, 0) for p in paths]})()), paths)
        self.assertEqual(coorfs.sample_paths(type("D", (), {"files": tuple(paths)})()), paths)
        self.assertEqual(coorfs.sample_paths(tuple(paths)), paths)

    def test_a_dataset_may_tell_its_paths_itself(self):
        paths = ["/m/a/1.jpg", "/m/b/2.jpg"]
        listed = type("D", (), {"coorfs_paths": paths, "samples": [("/elsewhere", 0)] * 2})()
        self.assertEqual(coorfs.sample_paths(listed), paths)
        self.assertEqual(coorfs.sample_paths(type("D", (), {"coorfs_paths": lambda self: paths})()), paths)

    def test_subsets_and_concatenations_of_datasets(self):
        paths = ["/m/%d.jpg" % i for i in range(5)]
        whole = FakeImageFolder(paths)
        subset = type("Subset", (), {"dataset": whole, "indices": [4, 0, 2]})()
        self.assertEqual(coorfs.sample_paths(subset), ["/m/4.jpg", "/m/0.jpg", "/m/2.jpg"])
        concat = type("ConcatDataset", (), {"datasets": [subset, whole], "cumulative_sizes": [3, 8]})()
        self.assertEqual(coorfs.sample_paths(concat), coorfs.sample_paths(subset) + paths)

    def test_unknown_dataset_says_what_to_pass(self):
        with self.assertRaisesRegex(TypeError, "pass paths=.* coorfs_paths"):
            coorfs.sample_paths([1, 2, 3])


class SendHint(unittest.TestCase):
    """The real send_hint, with the ioctls it makes recorded instead of made."""

    def test_the_hint_goes_in_fixed_size_chunks_then_a_commit(self):
        calls = []

        def ioctl(fd, request, arg=0, mutate=True):
            calls.append((request, bytes(arg) if isinstance(arg, bytearray) else arg))
            return 0

        data = b"".join(b"c%d/f%06d.jpg\n" % (i % 7, i) for i in range(3000))
        with tempfile.TemporaryDirectory() as mount:
            open(os.path.join(mount, coorfs.ORDER_FILE), "wb").close()
            real, coorfs.order.fcntl.ioctl = coorfs.order.fcntl.ioctl, ioctl
            try:
                _send_hint(mount, data)
            finally:
                coorfs.order.fcntl.ioctl = real
        chunks, commit = calls[:-1], calls[-1]
        self.assertEqual(commit, (coorfs.order.HINT_COMMIT, 0))
        sent = b""
        for request, chunk in chunks:
            self.assertEqual((request, len(chunk)), (coorfs.order.HINT_CHUNK, coorfs.order.CHUNK_BYTES))
            count = int.from_bytes(chunk[:4], "little")
            sent += chunk[4 : 4 + count]
        self.assertEqual(sent, data)
        self.assertEqual(len(chunks), -(-len(data) // (coorfs.order.CHUNK_BYTES - 4)))
        # The size field of the chunk's command number is the chunk's size: the kernel copies it.
        self.assertEqual((coorfs.order.HINT_CHUNK >> 16) & 0x3FFF, coorfs.order.CHUNK_BYTES)


class WriteOrder(unittest.TestCase):
    """A plain directory stands in for the mount: the order file is then an ordinary file."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.mount = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def test_paths_become_lines_relative_to_the_mount(self):
        coorfs.write_order(self.mount, [os.path.join(self.mount, "b", "2.jpg"), "a/1.jpg"])
        self.assertEqual(order_file(self.mount), b"b/2.jpg\na/1.jpg\n")

    def test_names_that_are_not_utf8_keep_their_bytes(self):
        name = os.fsdecode(b"caf\xe9.jpg")
        coorfs.write_order(self.mount, [name])
        self.assertEqual(order_file(self.mount), b"caf\xe9.jpg\n")

    def test_a_path_outside_the_mount_is_refused_and_nothing_written(self):
        with self.assertRaisesRegex(ValueError, "not below the mount"):
            coorfs.write_order(self.mount, ["a/1.jpg", "/etc/passwd"])
        self.assertFalse(os.path.exists(os.path.join(self.mount, coorfs.ORDER_FILE)))


class HintedOrderEpochs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.mount = self.dir.name
        self.paths = ["c%d/f%03d.bin" % (i % 4, i) for i in range(50)]

    def tearDown(self):
        self.dir.cleanup()

    def test_every_epoch_is_a_fresh_permutation_handed_over_first(self):
        order = coorfs.HintedOrder(self.paths, self.mount, seed=7, strict=True)
        first = order.next_epoch()
        self.assertEqual(sorted(first), list(range(50)))
        self.assertEqual(order_file(self.mount).decode().split(), [self.paths[i] for i in first])
        second = order.next_epoch()
        self.assertEqual(sorted(second), list(range(50)))
        self.assertNotEqual(first, second)
        self.assertEqual(order_file(self.mount).decode().split(), [self.paths[i] for i in second])

    def test_a_seed_gives_the_same_orders(self):
        a = coorfs.HintedOrder(self.paths, self.mount, seed=3)
        b = coorfs.HintedOrder(self.paths, self.mount, seed=3)
        self.assertEqual([a.next_epoch() for _ in range(3)], [b.next_epoch() for _ in range(3)])

    def test_a_group_gives_its_members_the_same_orders(self):
        a = coorfs.HintedOrder(self.paths, self.mount, group="hp-search-7")
        b = coorfs.HintedOrder(self.paths, self.mount, group="hp-search-7")
        c = coorfs.HintedOrder(self.paths, self.mount, group="hp-search-8")
        first = [a.next_epoch() for _ in range(3)]
        self.assertEqual(first, [b.next_epoch() for _ in range(3)])
        self.assertNotEqual(first, [c.next_epoch() for _ in range(3)])
        with self.assertRaisesRegex(ValueError, "a group or a seed"):
            coorfs.HintedOrder(self.paths, self.mount, seed=1, group="g")
        with self.assertRaisesRegex(ValueError, "non-empty string"):
            coorfs.HintedOrder(self.paths, self.mount, group="")

    def test_a_rejected_hint_warns_unless_strict(self):
        missing = os.path.join(self.mount, "no", "such", "dir")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            order = coorfs.HintedOrder(self.paths, missing)
            self.assertEqual(sorted(order.next_epoch()), list(range(50)))
            self.assertFalse(order.hint([0]))
        self.assertEqual(len(caught), 2)
        self.assertIn("not taken", str(caught[0].message))
        with self.assertRaises(OSError):
            coorfs.HintedOrder(self.paths, missing, strict=True).hint([0])


if __name__ == "__main__":
    unittest.main()
