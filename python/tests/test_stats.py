"""coorfs.stats without a mount: what it returns for an attribute, and its error elsewhere.
(tests/it/hints.rs reads the statistics of a real mount with it.)"""

import errno
import json
import tempfile
import unittest
from unittest import mock

import coorfs
import coorfs.stats


class ReadStats(unittest.TestCase):
    def test_the_attribute_becomes_a_dict(self):
        doc = {"hits": 3, "misses": 1, "epochs": [{"epoch": 1, "hit_rate": 0.75}]}
        with mock.patch.object(coorfs.stats.os, "getxattr", return_value=json.dumps(doc).encode()) as get:
            self.assertEqual(coorfs.read_stats("/mnt/train"), doc)
        get.assert_called_once_with("/mnt/train", "user.coorfs.stats")

    def test_cached_bytes_is_a_number(self):
        with mock.patch.object(coorfs.stats.os, "getxattr", return_value=b"110592") as get:
            self.assertEqual(coorfs.cached_bytes("/mnt/train/a/1.jpg"), 110592)
        get.assert_called_once_with("/mnt/train/a/1.jpg", "user.coorfs.cached")

    def test_a_directory_that_is_no_mount_says_so(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(OSError) as raised:
                coorfs.read_stats(d)
        self.assertIn(raised.exception.errno, (errno.ENODATA, errno.ENOTSUP))
        self.assertIn("not the root of a coorfs mount", str(raised.exception))

    def test_other_errors_pass_through(self):
        with self.assertRaises(FileNotFoundError):
            coorfs.read_stats("/no/such/mount")


if __name__ == "__main__":
    unittest.main()
