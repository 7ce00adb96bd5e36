"""coorfs.HintedSampler: without torch, a clear ImportError (and `import coorfs` never loads
torch); with torch (scripts/check-frameworks.sh runs these in its venv), the sampler's orders
and hints."""

import os
import subprocess
import sys
import tempfile
import unittest

import coorfs
import standin

# A plain directory stands in for the mount: hints are written to its order file.
standin.install(coorfs.order)

try:
    import torch
except ImportError:
    torch = None


class WithoutTorch(unittest.TestCase):
    def test_import_coorfs_does_not_load_torch(self):
        code = "import sys, coorfs; print('torch' in sys.modules)"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.strip(), "False")

    @unittest.skipIf(torch is not None, "torch is installed")
    def test_the_sampler_names_what_is_missing(self):
        with self.assertRaisesRegex(ImportError, "needs torch"):
            coorfs.HintedSampler


@unittest.skipIf(torch is None, "torch is not installed")
class WithTorch(unittest.TestCase):
    def test_each_epoch_yields_a_permutation_and_hints_it(self):
        with tempfile.TemporaryDirectory() as mount:
            paths = [os.path.join(mount, "c", "%02d.jpg" % i) for i in range(20)]
            g = torch.Generator()
            g.manual_seed(5)
            sampler = coorfs.HintedSampler(paths, mount, generator=g, strict=True)
            self.assertIsInstance(sampler, torch.utils.data.Sampler)
            self.assertEqual(len(sampler), 20)
            for _ in range(2):
                order = list(sampler)
                self.assertEqual(sorted(order), list(range(20)))
                with open(os.path.join(mount, coorfs.ORDER_FILE)) as f:
                    self.assertEqual(f.read().split(), ["c/%02d.jpg" % i for i in order])

    def test_a_group_draws_one_permutation_for_all_its_jobs(self):
        with tempfile.TemporaryDirectory() as mount:
            paths = [os.path.join(mount, "%02d.jpg" % i) for i in range(20)]
            a = coorfs.HintedSampler(paths, mount, group="hp-search-7")
            b = coorfs.HintedSampler(paths, mount, group="hp-search-7")
            self.assertEqual([list(a) for _ in range(2)], [list(b) for _ in range(2)])
            with self.assertRaisesRegex(ValueError, "a group or a generator"):
                coorfs.HintedSampler(paths, mount, group="g", generator=torch.Generator())

    def test_paths_must_match_the_samples(self):
        with self.assertRaisesRegex(ValueError, "3 paths for 2 samples"):
            coorfs.HintedSampler([0, 1], "/mnt", paths=["a", "b", "c"])


if __name__ == "__main__":
    unittest.main()
