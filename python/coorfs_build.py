"""The PEP 517 build backend of the coorfs package, with the standard library only.

pip runs it from this directory (pyproject.toml's `backend-path`), so `pip install ./python`
works with no network and no setuptools. It builds what pip asks for:

- a wheel (`build_wheel`): the `coorfs/` sources and a `.dist-info` (METADATA from
  pyproject.toml's [project], WHEEL, RECORD with every file's SHA-256);
- an editable wheel (`build_editable`, `pip install -e ./python`): a `.pth` file naming this
  directory instead of the sources;
- an sdist (`build_sdist`): this directory's sources, tests and PKG-INFO.

Only the fields pyproject.toml uses are read: name, version, description, requires-python,
optional-dependencies.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "coorfs"
TAG = "py3-none-any"
# Reproducible archives: a fixed timestamp (the zip format's earliest, 1980-01-01).
EPOCH = (1980, 1, 1, 0, 0, 0)


def _project():
    """pyproject.toml's [project] table (tomllib from 3.11 on; before, a reader of the plain
    `key = "string"` and `key = ["string", ...]` lines this file uses)."""
    path = os.path.join(HERE, "pyproject.toml")
    try:
        import tomllib
    except ImportError:
        return _read_simple_toml(path).get("project", {})
    with open(path, "rb") as f:
        return tomllib.load(f)["project"]


def _read_simple_toml(path):
    tables, table = {}, None
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[([\w.-]+)\]", line)
        if header:
            table = tables
            for part in header.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        key, _, value = (s.strip() for s in line.partition("="))
        strings = re.findall(r'"([^"]*)"', value)
        if table is not None:
            table[key] = strings if value.startswith("[") else strings[0]
    return tables


def _metadata(project):
    lines = [
        "Metadata-Version: 2.1",
        "Name: " + project["name"],
        "Version: " + project["version"],
        "Summary: " + project.get("description", ""),
    ]
    if "requires-python" in project:
        lines.append("Requires-Python: " + project["requires-python"])
    for requirement in project.get("dependencies", []):
        lines.append("Requires-Dist: " + requirement)
    for extra, requirements in project.get("optional-dependencies", {}).items():
        lines.append("Provides-Extra: " + extra)
        for requirement in requirements:
            lines.append('Requires-Dist: %s; extra == "%s"' % (requirement, extra))
    return "\n".join(lines) + "\n"


def _sources():
    """The package's files, relative to this directory, sorted."""
    return _python_files(PACKAGE)


def _python_files(directory):
    """The .py files below `directory` (relative to this one), relative to this one, sorted."""
    found = []
    for root, dirs, files in os.walk(os.path.join(HERE, directory)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [os.path.relpath(os.path.join(root, f), HERE) for f in files if f.endswith(".py")]
    return sorted(found)


def _wheel(directory, contents):
    """Writes a wheel of `contents` (archive name -> bytes) plus its dist-info; returns its name."""
    project = _project()
    name, version = project["name"], project["version"]
    dist_info = "%s-%s.dist-info" % (name, version)
    contents = dict(contents)
    contents[dist_info + "/METADATA"] = _metadata(project).encode()
    contents[dist_info + "/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: coorfs_build\nRoot-Is-Purelib: true\nTag: %s\n" % TAG
    ).encode()
    record = []
    for arcname, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (arcname, digest, len(data)))
    record.append(dist_info + "/RECORD,,")
    contents[dist_info + "/RECORD"] = ("\n".join(record) + "\n").encode()
    filename = "%s-%s-%s.whl" % (name, version, TAG)
    with zipfile.ZipFile(os.path.join(directory, filename), "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, data in contents.items():
            info = zipfile.ZipInfo(arcname, EPOCH)
            info.external_attr = 0o644 << 16
            whl.writestr(info, data, zipfile.ZIP_DEFLATED)
    return filename


def _read(relpath):
    with open(os.path.join(HERE, relpath), "rb") as f:
        return f.read()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {path: _read(path) for path in _sources()})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"coorfs.pth": (HERE + "\n").encode()})


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = "%s-%s" % (project["name"], project["version"])
    # The tests (with their stand-in torch) and `coorfs run`'s sitecustomize, which they use.
    files = ["pyproject.toml", "coorfs_build.py"] + _sources() + _python_files("tests") + _python_files("run-hook")
    contents = {path: _read(path) for path in files}
    contents["PKG-INFO"] = _metadata(project).encode()
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path, data in sorted(contents.items()):
            info = tarfile.TarInfo(base + "/" + path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return filename
