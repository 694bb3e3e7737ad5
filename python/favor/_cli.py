"""The `favor` console script of an installed wheel: runs the command-line tool that the
wheel carries in favor/_bin (the same C++ program as the build tree's build/tools/favor).
Its plots (`--plot`) use this interpreter unless FAVOR_PYTHON says otherwise."""
import os
import sys


def executable():
    """The path of the bundled tool, or None (a build tree has build/tools/favor instead)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "favor")
    return path if os.access(path, os.X_OK) else None


def main():
    path = executable()
    if path is None:
        sys.stderr.write("favor: this favor package has no bundled command-line tool (a build "
                         "tree: use build/tools/favor, or pip install the package)\n")
        return 2
    os.environ.setdefault("FAVOR_PYTHON", sys.executable)
    os.execv(path, [path, *sys.argv[1:]])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
