"""`coorfs run`'s hook (coorfs/run.py, run-hook/sitecustomize.py) without a mount: a plain
directory stands in for it (COORFS_MOUNT, as --mount sets it), and the hook's copy of the package
hands hints over by writing the order file there (standin.py), an ordinary file that the job
(run_job.py) reads back after each epoch. Each job runs in a fresh interpreter
started the way `coorfs run` starts one: the hook directory (sitecustomize.py beside the package
as `_coorfs_run`) first on PYTHONPATH, COORFS_RUN_DIR set.

Every job runs with python/tests/faketorch as torch; with torch installed (the venv of
scripts/check-frameworks.sh) the samplers run on the real torch too. Checked: the job prints the
same lines with and without the hook (indices, bytes, the random numbers drawn in workers and
after the last epoch), every epoch's hint names the paths of exactly the samples that epoch
read, and a job that gets no hint says why in one line, once per run. tests/it/run.rs does the
same through a real mount and `coorfs run`.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import standin

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "coorfs")
SITECUSTOMIZE = os.path.join(os.path.dirname(HERE), "run-hook", "sitecustomize.py")
FAKE_TORCH = os.path.join(HERE, "faketorch")
JOB = os.path.join(HERE, "run_job.py")
PREFIX = "coorfs run: no order hint: "
REAL_TORCH = importlib.util.find_spec("torch") is not None


class HookedRun:
    """One `coorfs run` of jobs: the hook directory, the dataset, the environment."""

    def __init__(self, torch_path):
        self.tmp = tempfile.TemporaryDirectory()
        self.hook = os.path.join(self.tmp.name, "hook")
        os.makedirs(os.path.join(self.hook, "status"))
        shutil.copy(SITECUSTOMIZE, self.hook)
        shutil.copytree(PACKAGE, os.path.join(self.hook, "_coorfs_run"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        with open(os.path.join(self.hook, "_coorfs_run", "order.py"), "a") as f:
            f.write(standin.STANDIN)
        self.data = os.path.join(self.tmp.name, "data")
        for i in range(40):
            folder = os.path.join(self.data, "class%d" % (i % 4))
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "f%03d.bin" % i), "wb") as f:
                f.write(os.urandom(100 + i))
        self.torch_path = torch_path

    def close(self):
        self.tmp.cleanup()

    def env(self, hook, mount):
        path = ([self.hook] if hook else []) + ([self.torch_path] if self.torch_path else [])
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=os.pathsep.join(path))
        for name in ("COORFS_RUN_DIR", "COORFS_MOUNT"):
            env.pop(name, None)
        if hook:
            env["COORFS_RUN_DIR"] = self.hook
            if mount:
                env["COORFS_MOUNT"] = mount
        return env

    def python(self, args, hook=True, mount=None):
        """Runs `python3 ARGS` as a process of this run; returns (stdout, stderr)."""
        out = subprocess.run([sys.executable, *args], env=self.env(hook, mount), capture_output=True,
                             text=True, timeout=300)
        if out.returncode != 0:
            raise AssertionError("%s failed:\n%s" % (args, out.stderr))
        return out.stdout, out.stderr

    def job(self, *args, hook=True, mount="data"):
        """run_job.py ARGS over the dataset; returns (per-epoch reports, the final line, stderr)."""
        mount = self.data if mount == "data" else mount
        extra = ["--show-order"] if hook else []
        stdout, stderr = self.python([JOB, *args, *extra, self.data], hook=hook, mount=mount)
        lines = [json.loads(line) for line in stdout.splitlines()]
        return lines[:-1], lines[-1], stderr

    def markers(self):
        return {m for m in os.listdir(os.path.join(self.hook, "status")) if not m.startswith("said-")}


class Jobs:
    torch_path = FAKE_TORCH

    def setUp(self):
        self.hooked = HookedRun(self.torch_path)

    def tearDown(self):
        self.hooked.close()

    def assert_hinted_unchanged(self, *args):
        plain, plain_after, _ = self.hooked.job(*args, hook=False)
        hooked, hooked_after, stderr = self.hooked.job(*args)
        self.assertEqual(stderr, "", args)
        self.assertEqual(hooked_after, plain_after, args)
        self.assertEqual(len(hooked), len(plain))
        for seen, want in zip(hooked, plain):
            order = seen.pop("order")
            self.assertEqual(seen, want, args)
            self.assertEqual(order, seen["samples"], args)
        self.assertIn("hinted", self.hooked.markers())


class SamplersOnFakeTorch(Jobs, unittest.TestCase):
    def test_each_sampler_sees_the_same_epochs_and_hints_each(self):
        for sampler in ("shuffle", "sequential", "subset", "weighted", "distributed", "batch"):
            for workers in ("0", "2"):
                with self.subTest(sampler=sampler, workers=workers):
                    self.assert_hinted_unchanged("--sampler", sampler, "--workers", workers, "--seed", "7")

    def test_every_rank_hints_its_own_shard(self):
        for rank in ("0/2", "1/2"):
            self.assert_hinted_unchanged("--sampler", "distributed", "--rank", rank, "--workers", "2")

    def test_persistent_workers_are_hinted_every_epoch(self):
        self.assert_hinted_unchanged("--workers", "2", "--persistent", "--seed", "3")

    def test_each_shape_of_dataset_tells_its_paths(self):
        for dataset in ("samples", "imgs", "coorfs_paths", "method", "subset", "concat"):
            with self.subTest(dataset=dataset):
                self.assert_hinted_unchanged("--dataset", dataset, "--workers", "2")


@unittest.skipUnless(REAL_TORCH, "torch is not installed")
class SamplersOnTorch(Jobs, unittest.TestCase):
    torch_path = None

    def test_each_sampler_sees_the_same_epochs_and_hints_each(self):
        SamplersOnFakeTorch.test_each_sampler_sees_the_same_epochs_and_hints_each(self)

    def test_persistent_workers_are_hinted_every_epoch(self):
        SamplersOnFakeTorch.test_persistent_workers_are_hinted_every_epoch(self)

    def test_datasets_of_torch_tell_their_paths(self):
        for dataset in ("subset", "concat"):
            self.assert_hinted_unchanged("--dataset", dataset)


class WithoutAHint(Jobs, unittest.TestCase):
    """Whatever stops the hint, the job runs as without the hook and one line says why."""

    def assert_unchanged_saying(self, why, *args, mount="data"):
        plain = self.hooked.job(*args, hook=False)[:2]
        reports, after, stderr = self.hooked.job(*args, mount=mount)
        for r in reports:
            r.pop("order")
        self.assertEqual((reports, after), plain)
        lines = stderr.splitlines()
        self.assertEqual(len(lines), 1, stderr)
        self.assertTrue(lines[0].startswith(PREFIX), stderr)
        self.assertIn(why, lines[0])
        self.assertNotIn("hinted", self.hooked.markers())
        # Said once a run: another process of the run with the same trouble says nothing.
        self.assertEqual(self.hooked.job(*args, mount=mount)[2], "")

    def test_a_dataset_without_paths(self):
        self.assert_unchanged_saying("cannot tell the file of each sample", "--dataset", "none", "--workers", "2")

    def test_a_dataset_whose_paths_fail(self):
        self.assert_unchanged_saying("the hook failed: RuntimeError", "--dataset", "broken")

    def test_an_iterable_dataset(self):
        self.assert_unchanged_saying("an IterableDataset has no sampler order", "--dataset", "stream")

    def test_a_sampler_it_does_not_know(self):
        self.assert_unchanged_saying("its sampler Reversed is not one coorfs run follows", "--sampler", "custom")

    def test_files_outside_the_given_mount(self):
        self.assert_unchanged_saying("is not below --mount %s" % self.hooked.hook, mount=self.hooked.hook)

    def test_files_on_no_coorfs_mount(self):
        self.assert_unchanged_saying("is not on a coorfs mount", mount=None)

    def test_a_mount_that_refuses_the_hint(self):
        os.mkdir(os.path.join(self.hooked.data, ".coorfs-order"))
        self.assert_unchanged_saying("refused the order of a DataLoader over Folder: Is a directory")

    def test_a_sampler_that_hints_by_itself_is_left_alone(self):
        plain = self.hooked.job("--sampler", "own", hook=False)[:2]
        reports, after, stderr = self.hooked.job("--sampler", "own")
        self.assertEqual([r.pop("order") for r in reports], [None] * len(reports))
        self.assertEqual(((reports, after), stderr), (plain, ""))


class StartUp(unittest.TestCase):
    def setUp(self):
        self.hooked = HookedRun(FAKE_TORCH)

    def tearDown(self):
        self.hooked.close()

    def test_python_without_torch_runs_as_always_and_leaves_its_marker(self):
        self.assertEqual(self.hooked.python(["-c", "print(6 * 7)"]), ("42\n", ""))
        self.assertEqual(self.hooked.markers(), {"loaded"})

    def test_the_hook_is_in_place_once_torch_is_imported(self):
        code = "import torch.utils.data as d; print(d.DataLoader._index_sampler.fget.coorfs_run)"
        self.assertEqual(self.hooked.python(["-c", code]), ("True\n", ""))
        self.assertEqual(self.hooked.markers(), {"loaded", "torch"})

    def test_the_sitecustomize_it_hides_still_runs(self):
        theirs = os.path.join(self.hooked.tmp.name, "theirs")
        os.mkdir(theirs)
        with open(os.path.join(theirs, "sitecustomize.py"), "w") as f:
            f.write("import sys\nTHEIRS = True\nsys.stderr.write('their sitecustomize\\n')\n")
        code = "import sitecustomize, _coorfs_run.run as r; print(sitecustomize.THEIRS, r._installed)"
        env = self.hooked.env(hook=True, mount=None)
        env["PYTHONPATH"] += os.pathsep + theirs
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        self.assertEqual((out.stdout, out.stderr), ("True True\n", "their sitecustomize\n"))

    def test_a_hook_that_cannot_load_says_so_and_the_program_goes_on(self):
        shutil.rmtree(os.path.join(self.hooked.hook, "_coorfs_run"))
        out, err = self.hooked.python(["-c", "print('on')"])
        self.assertEqual(out, "on\n")
        self.assertTrue(err.startswith(PREFIX + "the hook did not load: ModuleNotFoundError"), err)


class Mountinfo(unittest.TestCase):
    def test_escaped_mount_points_are_decoded(self):
        from coorfs import run

        self.assertEqual(run._unescape(b"/mnt/my\\040data\\134x"), b"/mnt/my data\\x")

    def test_only_coorfs_mounts_are_listed(self):
        from coorfs import run

        self.assertNotIn("/proc", run.coorfs_mounts())


if __name__ == "__main__":
    unittest.main()
