"""``python -m onnx_fuse ARGS``: the ``onnx-fuse`` command of this package."""

import os
import subprocess
import sys

from onnx_fuse import Error, binary


def main() -> int:
    try:
        path = binary()
    except Error as e:
        print(e.message, file=sys.stderr)
        return 1
    argv = [path] + sys.argv[1:]
    if os.name == "posix":
        os.execv(path, argv)  # the process becomes the binary: signals, exit code, terminal
    return subprocess.call(argv)


if __name__ == "__main__":
    sys.exit(main())
