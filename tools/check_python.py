"""Create the course's virtual environment with a Python it supports (``make env`` runs this first).

    python3 tools/check_python.py .venv    # .venv from python3, or from a CPython 3.11 that uv downloads
    python3 tools/check_python.py          # only the check: exit 1 with one sentence when python3 cannot do

constraints.txt resolves for Python 3.11.5 (soupsieve 4.1.2 needs it) to 3.14 (the last that torch 2.13.0 has
wheels for). An interpreter outside that range (Debian 12's 3.11.2, a 3.10, a 3.15) is not refused: the environment
gets a CPython 3.11, the version CI tests, managed by uv (python-build-standalone, kept in uv's own folder), and one
line says so. uv comes from PATH, or is installed by this interpreter's pip, at the version constraints.txt pins,
into a temporary folder. Where neither works (offline, no pip), one sentence says what to install. Written for old
interpreters too (Python 2.7 parses it): it must say why, not fail on a syntax error.
"""
import os
import shutil
import subprocess
import sys
import tempfile

OLDEST = (3, 11, 5)
NEWEST = (3, 14)
MANAGED = "3.11"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPPORTED = "Python 3.11.5 to 3.14"
INSTALL = ("install Python 3.12 (python.org's installer, or your system's python3.12 package) or connect to the "
           "internet, and run make env again (make env PYTHON=/path/to/python3.12 if it is not python3)")


def _dotted(version):
    return ".".join(str(part) for part in version[:3])


def problem(version):
    """None where ``version`` (a sys.version_info) can build the environment, else why not, in one sentence."""
    if OLDEST <= tuple(version[:3]) and tuple(version[:2]) <= NEWEST:
        return None
    return "make env needs {0}, found {1}".format(SUPPORTED, _dotted(version))


def _on_path(name):
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _quiet(command):
    """Run ``command`` with its output kept back (a failure is summed up in one sentence): True when it succeeded."""
    with open(os.devnull, "w") as devnull:
        try:
            return subprocess.call(command, stdout=devnull, stderr=devnull) == 0
        except OSError:
            return False


def uv_venv(venv, found):
    """``venv`` from a uv-managed CPython 3.11: None when made, else the sentence that says what to install."""
    scratch = tempfile.mkdtemp(prefix="minigpt-uv-")
    try:
        uv = _on_path("uv")
        if uv is None and _quiet([sys.executable, "-m", "pip", "install", "--quiet", "--target", scratch,
                                  "-c", os.path.join(ROOT, "constraints.txt"), "uv"]):
            uv = os.path.join(scratch, "bin", "uv")
        if uv is None:
            return "{0}, and no uv to get one with (pip could not install it): {1}".format(problem(found), INSTALL)
        sys.stderr.write("Python {0} ({1}) is not one the course supports ({2}): {3} gets a CPython {4} that uv "
                         "downloads and manages.\n".format(_dotted(found), sys.executable, SUPPORTED, venv, MANAGED))
        shutil.rmtree(venv, ignore_errors=True)
        if not _quiet([uv, "venv", "--quiet", "--seed", "--managed-python", "--python", MANAGED, venv]):
            shutil.rmtree(venv, ignore_errors=True)
            return "{0}, and uv could not download CPython {1}: {2}".format(problem(found), MANAGED, INSTALL)
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def make_venv(venv, version):
    """``venv`` made afresh, by this interpreter where ``version`` is supported, else by uv: None, or why not."""
    if problem(version) is None:
        shutil.rmtree(venv, ignore_errors=True)
        return None if subprocess.call([sys.executable, "-m", "venv", venv]) == 0 else (
            "{0} -m venv failed (its message is above)".format(sys.executable))
    return uv_venv(venv, version)


if __name__ == "__main__":
    version = tuple(sys.version_info)
    if len(sys.argv) > 1:
        message = make_venv(sys.argv[1], version)
    else:
        message = problem(version) and "{0}: {1}".format(problem(version), INSTALL)
    if message:
        sys.stderr.write(message + "\n")
        sys.exit(1)
