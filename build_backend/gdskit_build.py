"""The PEP 517 build backend of the gdskit Python package (pyproject.toml names it with backend-path).

It needs only the Python standard library, so `pip install .` works offline, with or without build isolation:
there is nothing to download. The wheel is built by CMake in Release: the pybind11 extension (gdskit._gdskit),
the package's Python files and the `gdskit` command-line program, which pip installs into the environment's
bin/ folder. What the build needs comes from the system: cmake, a C++20 compiler, pybind11 and the Python
headers (Debian: cmake g++ pybind11-dev python3-dev; ninja-build is used when present).

Settings, as environment variables or as pip's --config-settings (-C key=value):
  GDSKIT_BUILD_DIR  / build-dir    the CMake build folder. Default: build/release when scripts/run.sh made it
                                   (its library and program are reused, only the module is compiled), else
                                   build/wheel-<python tag>; either is kept, so a second install only rebuilds
                                   what changed. A folder that is already configured keeps its build type
                                   and options and gets the module added (CI passes its own build).
  GDSKIT_CMAKE_ARGS / cmake-args   extra arguments for the CMake configure step (shell-quoted)
  CMAKE_BUILD_PARALLEL_LEVEL       parallel compile jobs (default: the number of CPUs)
  GDSKIT_BUILD_VERBOSE=1           every line of CMake and the compiler instead of steps and counts
  GDSKIT_NO_CCACHE=1               a new build folder without ccache (used when installed)
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
import time
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


class _Progress:
    """Build output as a person reads it: numbered steps, and for the compile step a count of what is done
    ("compiling 57/180"), redrawn in place on a terminal and every tenth otherwise. The compiler's own lines are
    kept and shown only when the step fails (then the lines from the first failure on). `--verbose` or
    GDSKIT_BUILD_VERBOSE=1 shows every line as it comes.

    pip hides a backend's output unless run with -v, so when stderr is not a terminal and a terminal is
    attached (pip's spinner), progress goes to the terminal itself."""

    STATUS = re.compile(r"^\[\s*(\d+)/(\d+)\]\s*(.*)$")          # ninja: [57/180] Building CXX object ...
    MAKE_STATUS = re.compile(r"^\[\s*(\d+)%\]\s*(.*)$")           # make: [ 31%] Building CXX object ...

    def __init__(self, steps: int, out=None):
        self.steps = steps
        self.step = 0
        self.verbose = os.environ.get("GDSKIT_BUILD_VERBOSE", "") not in ("", "0")
        self._tty = None
        if out is None:
            out = sys.stderr
            if not out.isatty() and os.environ.get("PIP_BUILD_TRACKER") is not None:
                try:
                    self._tty = open("/dev/tty", "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
                    out = self._tty
                except OSError:
                    pass
        self.out = out
        self.interactive = out.isatty()

    def close(self):
        if self._tty is not None:
            self._tty.close()

    def say(self, text: str):
        print(f"gdskit build: {text}", file=self.out, flush=True)

    def run(self, what: str, cmd, **kw):
        """Runs one step, showing its progress; raises CalledProcessError with the step's output shown."""
        self.step += 1
        prefix = f"[{self.step}/{self.steps}] {what}" if self.steps else what
        if self.verbose:
            self.say(prefix + ": " + " ".join(shlex.quote(str(c)) for c in cmd))
            subprocess.run([str(c) for c in cmd], check=True, **kw)
            return
        start = time.monotonic()
        self.say(prefix)
        env = dict(kw.pop("env", None) or os.environ)
        env.setdefault("NINJA_STATUS", "[%f/%t] ")
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                text=True, errors="replace", **kw)
        lines, shown_tenth, width, last_total = [], -1, 0, None
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            m = self.STATUS.match(line)
            if m:
                done, total, desc = int(m.group(1)), int(m.group(2)), m.group(3)
            elif (m2 := self.MAKE_STATUS.match(line)):
                done, total, desc = int(m2.group(1)), 100, m2.group(2)
            else:
                continue
            if desc.startswith("Re-checking globbed"):
                continue  # cmake --build's check of the source folders: not a step of the build
            last = desc.rsplit("/", 1)[-1].removesuffix(".o")
            name = ("compile " + last if desc.startswith("Building") else "link " + last
                    if desc.startswith("Linking") else " ".join(desc.split(" ")[:3]))
            text = f"  {done}/{total} ({100 * done // max(total, 1)}%) {name}"[:100]
            if self.interactive:
                self.out.write("\r" + text.ljust(width))
                self.out.flush()
                width = len(text)
                continue
            if total != last_total:
                # A new count (cmake --build's check of globbed folders runs first, then the build itself).
                last_total, shown_tenth = total, -1
            if 10 * done // max(total, 1) > shown_tenth:
                shown_tenth = 10 * done // max(total, 1)
                print(text, file=self.out, flush=True)
        rc = proc.wait()
        if self.interactive and width:
            self.out.write("\r" + " " * width + "\r")
        if rc != 0:
            first = next((i for i, l in enumerate(lines) if l.startswith(("FAILED:", "CMake Error", "make: ***"))
                          or " error:" in l), max(len(lines) - 60, 0))
            print("\n".join(lines[first:]), file=sys.stderr, flush=True)
            self.say(f"{prefix} failed (exit {rc}); the command was: " + " ".join(shlex.quote(str(c)) for c in cmd))
            raise subprocess.CalledProcessError(rc, cmd)
        self.say(f"{prefix}: done in {time.monotonic() - start:.0f} s")


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


def _cache_value(build_dir: Path, key: str):
    try:
        text = (build_dir / "CMakeCache.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(rf"^{re.escape(key)}:[A-Z]+=(.*)$", text, re.M)
    return m.group(1) if m else None


def _reusable(build_dir: Path) -> bool:
    """Whether `build_dir` is a configured build of this source tree that the wheel can be built in: its library
    and program are reused and only the Python module is added."""
    home = _cache_value(build_dir, "CMAKE_HOME_DIRECTORY")
    return home is not None and Path(home).resolve() == SOURCE.resolve()


def _choose_build_dir(config_settings) -> Path:
    """The folder named by build-dir / GDSKIT_BUILD_DIR; else scripts/run.sh's build/release when it exists (an
    optimised build of the program is already there: only the module is compiled); else build/wheel-<tag>."""
    named = _setting(config_settings, "build-dir", "GDSKIT_BUILD_DIR")
    if named:
        return Path(named).resolve()
    release = SOURCE / "build" / "release"
    if _reusable(release) and _cache_value(release, "CMAKE_BUILD_TYPE") == "Release":
        return release
    return SOURCE / "build" / f"wheel-{_tag()}"


def _build(config_settings, staging: Path):
    """Configures (or reuses a configured build folder), builds the module and the program, then installs the
    python and cli components into `staging`."""
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("gdskit build: cmake not found (Debian: apt-get install cmake)")
    build_dir = _choose_build_dir(config_settings)
    reuse = (build_dir / "CMakeCache.txt").exists()
    if reuse and not _reusable(build_dir):
        raise RuntimeError(f"gdskit build: {build_dir} is a build folder of another source tree "
                           f"({_cache_value(build_dir, 'CMAKE_HOME_DIRECTORY')}); name another with GDSKIT_BUILD_DIR")
    # A configured folder keeps its build type and options (the ci stage's, run.sh's Release): the module is
    # added to it. A new one is a Release build of the module and the program only.
    args = [f"-DPython3_EXECUTABLE={sys.executable}", "-DGDSKIT_BUILD_PYTHON=ON", "-DGDSKIT_BUILD_CLI=ON"]
    if not reuse:
        args += ["-DCMAKE_BUILD_TYPE=Release", "-DGDSKIT_BUILD_TESTS=OFF", "-DGDSKIT_BUILD_BENCHMARKS=OFF",
                 "-DGDSKIT_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF"]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if shutil.which("ccache") and os.environ.get("GDSKIT_NO_CCACHE", "") in ("", "0"):
            args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    pybind11_dir = _pybind11_cmake_dir()
    if pybind11_dir:
        args.append(f"-Dpybind11_DIR={pybind11_dir}")
    args += shlex.split(_setting(config_settings, "cmake-args", "GDSKIT_CMAKE_ARGS") or "")
    progress = _Progress(steps=3)
    try:
        if reuse:
            progress.say(f"reusing {build_dir} (its library and program are built once; only what changed is built)")
        progress.run("configure", [cmake, "-S", SOURCE, "-B", build_dir, *args])
        if not (build_dir / "python" / "CMakeFiles" / "gdskit_python.dir").exists():
            raise RuntimeError("gdskit build: CMake found no pybind11 or Python headers for " + sys.executable +
                               " (Debian: apt-get install pybind11-dev python3-dev), so the module cannot be built")
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        progress.run("compile the module and the gdskit program",
                     [cmake, "--build", build_dir, "--target", "gdskit_python", "gdskit_cli", "--parallel", jobs])
        progress.run("install into the wheel",
                     [cmake, "--install", build_dir, "--component", "python", "--prefix", staging / "platlib"])
        subprocess.run([cmake, "--install", build_dir, "--component", "cli", "--prefix", staging / "cli"],
                       check=True, stdout=subprocess.DEVNULL)
    finally:
        progress.close()


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


def _main(argv) -> int:
    """`python3 build_backend/gdskit_build.py step LABEL -- COMMAND...`: runs one build command of the scripts
    (scripts/run.sh, scripts/test.sh) with the progress the wheel build shows."""
    if len(argv) >= 4 and argv[0] == "step" and argv[2] == "--":
        progress = _Progress(steps=0)
        try:
            progress.run(argv[1], argv[3:])
        except subprocess.CalledProcessError as e:
            return e.returncode or 1
        except OSError as e:
            print(f"gdskit build: {argv[3]}: {e.strerror}", file=sys.stderr)
            return 127
        return 0
    print("usage: gdskit_build.py step LABEL -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
