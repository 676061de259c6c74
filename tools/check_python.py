"""Exit with one sentence when the interpreter cannot build the course's environment (``make env`` runs this first).

constraints.txt pins the versions the course is tested with, on Python 3.11: some pins need 3.11.5 or later
(soupsieve 4.1.2), and on 3.12 and later the set does not resolve. Written for old interpreters too: it must say
why, not fail on a syntax error.
"""
import sys

NEEDED = (3, 11, 5)


def problem(version):
    if version[:2] == NEEDED[:2] and version[:3] >= NEEDED:
        return None
    found = ".".join(str(part) for part in version[:3])
    return ("make env needs Python 3.11.5 or a later 3.11 (constraints.txt pins the versions the course is tested "
            "with there), found {0}: run it as make env PYTHON=/path/to/python3.11".format(found))


if __name__ == "__main__":
    message = problem(tuple(sys.version_info))
    if message:
        sys.stderr.write(message + "\n")
        sys.exit(1)
