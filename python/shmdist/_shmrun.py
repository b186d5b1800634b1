"""The `shmrun` command of a pip-installed shmdist: runs the launcher binary shipped in the
package (shmdist/bin/shmrun), replacing this process, so that signals, the exit status and
the terminal go to shmrun itself."""

import os
import sys


def main():
    launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "shmrun")
    if not os.access(launcher, os.X_OK):
        sys.exit(f"shmrun: the launcher binary {launcher} is missing or not executable; "
                 "reinstall shmdist (pip install --force-reinstall .)")
    os.execv(launcher, [launcher] + sys.argv[1:])


if __name__ == "__main__":
    main()
