"""The build backend (coorfs_build.py), called as pip calls it: the wheel holds the package and
a dist-info that checks out, and imports from where it was unpacked; the editable wheel points
at this directory; the sdist holds what a rebuild needs. (A real `pip install ./python` into a
fresh venv, offline, is in .ci/run.)"""

import base64
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import coorfs_build  # noqa: E402


class Build(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def test_wheel_holds_the_package_with_a_consistent_record(self):
        name = coorfs_build.build_wheel(self.out)
        project = coorfs_build._project()
        self.assertEqual(name, "coorfs-%s-py3-none-any.whl" % project["version"])
        dist_info = "coorfs-%s.dist-info/" % project["version"]
        with zipfile.ZipFile(os.path.join(self.out, name)) as whl:
            names = set(whl.namelist())
            for module in ("__init__", "order", "run", "sampler", "stats"):
                self.assertIn("coorfs/%s.py" % module, names)
            self.assertFalse([n for n in names if "__pycache__" in n or n.startswith("tests/")])
            metadata = whl.read(dist_info + "METADATA").decode()
            self.assertIn("Name: coorfs\n", metadata)
            self.assertIn('Requires-Dist: torch; extra == "torch"\n', metadata)
            record = whl.read(dist_info + "RECORD").decode().splitlines()
            self.assertEqual({line.split(",")[0] for line in record}, names)
            for line in record:
                path, digest, size = line.split(",")
                if path.endswith("RECORD"):
                    continue
                data = whl.read(path)
                want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual((digest, int(size)), ("sha256=" + want, len(data)), path)
            whl.extractall(os.path.join(self.out, "site"))
        code = "import sys; sys.path.insert(0, sys.argv[1]); import coorfs; print(coorfs.__file__)"
        out = subprocess.run([sys.executable, "-I", "-c", code, os.path.join(self.out, "site")],
                             capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.strip(), os.path.join(self.out, "site", "coorfs", "__init__.py"))

    def test_editable_wheel_points_here(self):
        name = coorfs_build.build_editable(self.out)
        with zipfile.ZipFile(os.path.join(self.out, name)) as whl:
            self.assertEqual(whl.read("coorfs.pth").decode().strip(), HERE)

    def test_sdist_holds_the_sources_and_the_backend(self):
        name = coorfs_build.build_sdist(self.out)
        with tarfile.open(os.path.join(self.out, name)) as tar:
            names = {n.split("/", 1)[1] for n in tar.getnames()}
        for want in ("pyproject.toml", "coorfs_build.py", "PKG-INFO", "coorfs/__init__.py", "tests/test_build.py",
                     "tests/faketorch/torch/utils/data/__init__.py", "run-hook/sitecustomize.py"):
            self.assertIn(want, names)

    def test_pyproject_reads_the_same_without_tomllib(self):
        path = os.path.join(HERE, "pyproject.toml")
        self.assertEqual(coorfs_build._read_simple_toml(path)["project"], coorfs_build._project())


if __name__ == "__main__":
    unittest.main()
