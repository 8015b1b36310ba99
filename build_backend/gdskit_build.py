"""The PEP 517 build backend of the gdskit Python package (pyproject.toml names it with backend-path).

It needs only the Python standard library, so `pip install .` works offline, with or without build isolation:
there is nothing to download. The wheel is built by CMake in Release: the pybind11 extension (gdskit._gdskit),
the package's Python files and the `gdskit` command-line program, which pip installs into the environment's
bin/ folder. What the build needs comes from the system: cmake, a C++20 compiler, pybind11 and the Python
headers (Debian: cmake g++ pybind11-dev python3-dev; ninja-build is used when present).

Settings, as environment variables or as pip's --config-settings (-C key=value):
  GDSKIT_BUILD_DIR  / build-dir    the CMake build folder (default: build/wheel-<python tag> in the source tree,
                                   kept so a second install only rebuilds what changed)
  GDSKIT_CMAKE_ARGS / cmake-args   extra arguments for the CMake configure step (shell-quoted)
  CMAKE_BUILD_PARALLEL_LEVEL       parallel compile jobs (default: the number of CPUs)
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent
NAME = "gdskit"


# ---- metadata ------------------------------------------------------------------------------------------------

def _version() -> str:
    """The version in CMakeLists.txt's project(): the one version source."""
    text = (SOURCE / "CMakeLists.txt").read_text(encoding="utf-8")
    m = re.search(r"project\(\s*gdskit\s+VERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise RuntimeError("gdskit build: no project(gdskit VERSION x.y.z) in CMakeLists.txt")
    return m.group(1)


def _project() -> dict:
    try:
        import tomllib  # noqa: PLC0415 (Python 3.11+)
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # noqa: PLC0415
        except ModuleNotFoundError:
            raise RuntimeError("gdskit build: reading pyproject.toml needs Python 3.11+ (tomllib) or tomli") from None
    with open(SOURCE / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _metadata() -> str:
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {_version()}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    if isinstance(p.get("license"), dict) and "text" in p["license"]:
        lines.append(f"License: {p['license']['text']}")
    lines += [f"Classifier: {c}" for c in p.get("classifiers", [])]
    for extra, reqs in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    lines += [f"Requires-Dist: {r}" for r in p.get("dependencies", [])]
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str):
        lines.append("Description-Content-Type: text/markdown" if readme.endswith(".md") else
                     "Description-Content-Type: text/plain")
        body = "\n" + (SOURCE / readme).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n" + body


def _tag() -> str:
    """interpreter-abi-platform of this interpreter, e.g. cp311-cp311-linux_x86_64."""
    ver = f"{sys.version_info[0]}{sys.version_info[1]}"
    if sys.implementation.name == "cpython":
        interp = f"cp{ver}"
        abi = interp + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "")
        abi += "d" if hasattr(sys, "gettotalrefcount") else ""
    else:
        interp = f"{sys.implementation.name[:2]}{ver}"
        abi = (sysconfig.get_config_var("SOABI") or "none").replace("-", "_").replace(".", "_")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{interp}-{abi}-{plat}"


def _dist_info() -> str:
    return f"{NAME}-{_version()}.dist-info"


def _wheel_file(tag: str) -> str:
    return f"Wheel-Version: 1.0\nGenerator: gdskit_build\nRoot-Is-Purelib: false\nTag: {tag}\n"


# ---- the CMake build -----------------------------------------------------------------------------------------

def _setting(config_settings, key: str, env: str):
    if config_settings and config_settings.get(key):
        return config_settings[key]
    return os.environ.get(env) or None


def _run(cmd, **kw):
    print("gdskit build: " + " ".join(shlex.quote(str(c)) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def _pybind11_cmake_dir():
    """pybind11's CMake folder when pybind11 is a Python package (pip) rather than a system one (Debian's
    pybind11-dev, which CMake finds by itself). Under pip's build isolation the interpreter's own
    site-packages are hidden from this process, so the interpreters are also asked with a clean environment."""
    try:
        import pybind11  # noqa: PLC0415

        return pybind11.get_cmake_dir()
    except ImportError:
        pass
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    for exe in dict.fromkeys([sys.executable, getattr(sys, "_base_executable", None)]):
        if not exe:
            continue
        r = subprocess.run([exe, "-c", "import pybind11; print(pybind11.get_cmake_dir())"], env=env,
                           capture_output=True, text=True, check=False)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    return None


def _build(config_settings, staging: Path):
    """Configures and builds in Release, then installs the python and cli components into `staging`."""
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("gdskit build: cmake not found (Debian: apt-get install cmake)")
    build_dir = Path(_setting(config_settings, "build-dir", "GDSKIT_BUILD_DIR") or SOURCE / "build" / f"wheel-{_tag()}")
    args = ["-DCMAKE_BUILD_TYPE=Release", f"-DPython3_EXECUTABLE={sys.executable}", "-DGDSKIT_BUILD_PYTHON=ON",
            "-DGDSKIT_BUILD_CLI=ON", "-DGDSKIT_BUILD_TESTS=OFF", "-DGDSKIT_BUILD_BENCHMARKS=OFF",
            "-DGDSKIT_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF"]
    if not (build_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
        args += ["-G", "Ninja"]
    pybind11_dir = _pybind11_cmake_dir()
    if pybind11_dir:
        args.append(f"-Dpybind11_DIR={pybind11_dir}")
    args += shlex.split(_setting(config_settings, "cmake-args", "GDSKIT_CMAKE_ARGS") or "")
    _run([cmake, "-S", SOURCE, "-B", build_dir, *args])
    if not (build_dir / "python" / "CMakeFiles" / "gdskit_python.dir").exists():
        raise RuntimeError("gdskit build: CMake found no pybind11 or Python headers for " + sys.executable +
                           " (Debian: apt-get install pybind11-dev python3-dev), so the module cannot be built")
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    _run([cmake, "--build", build_dir, "--target", "gdskit_python", "gdskit_cli", "--parallel", jobs])
    _run([cmake, "--install", build_dir, "--component", "python", "--prefix", staging / "platlib"])
    _run([cmake, "--install", build_dir, "--component", "cli", "--prefix", staging / "cli"])


# ---- the wheel -----------------------------------------------------------------------------------------------

class _Wheel:
    """A wheel being written: every file goes through add(), which keeps RECORD."""

    def __init__(self, path: Path):
        self._zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self._record = []

    def add(self, arcname: str, data: bytes, executable: bool = False):
        info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
        self._zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self._record.append((arcname, f"sha256={digest}", str(len(data))))

    def add_tree(self, root: Path, prefix: str = ""):
        for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            self.add(prefix + f.relative_to(root).as_posix(), f.read_bytes(), os.access(f, os.X_OK))

    def close(self, record_name: str):
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerows(self._record)
        w.writerow((record_name, "", ""))
        self._zip.writestr(zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0)), out.getvalue())
        self._zip.close()


def _write_dist_info(target: Path, tag: str) -> str:
    d = target / _dist_info()
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata(), encoding="utf-8")
    (d / "WHEEL").write_text(_wheel_file(tag), encoding="utf-8")
    return d.name


# ---- PEP 517 hooks -------------------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(Path(metadata_directory), _tag())


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    tag = _tag()
    name = f"{NAME}-{_version()}-{tag}.whl"
    with tempfile.TemporaryDirectory(prefix="gdskit-wheel-") as tmp:
        staging = Path(tmp)
        _build(config_settings, staging)
        binary = staging / "cli" / "bin" / "gdskit"
        if not (staging / "platlib" / "gdskit" / "__init__.py").is_file() or not binary.is_file():
            raise RuntimeError("gdskit build: the CMake install did not produce the package and the gdskit program")
        _write_dist_info(staging / "meta", tag)
        wheel = _Wheel(Path(wheel_directory) / name)
        wheel.add_tree(staging / "platlib")
        # The program goes to the environment's bin/ (the wheel's scripts folder), executable, unchanged.
        wheel.add(f"{NAME}-{_version()}.data/scripts/gdskit", binary.read_bytes(), executable=True)
        wheel.add_tree(staging / "meta")
        wheel.close(f"{_dist_info()}/RECORD")
    return name


def _sdist_files():
    """The tracked files when the source is a git checkout, else every file outside build folders."""
    try:
        r = subprocess.run(["git", "-C", str(SOURCE), "ls-files", "-z"], capture_output=True, check=True)
        files = [f for f in r.stdout.decode().split("\0") if f]
        if files:
            return [f for f in files if (SOURCE / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        pass
    skip = {".git", "__pycache__"}
    out = []
    for p in sorted(SOURCE.rglob("*")):
        rel = p.relative_to(SOURCE)
        if p.is_file() and not skip.intersection(rel.parts) and not rel.parts[0].startswith("build"):
            out.append(rel.as_posix())
    return out


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for f in _sdist_files():
            tar.add(SOURCE / f, arcname=f"{base}/{f}", recursive=False)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return name
