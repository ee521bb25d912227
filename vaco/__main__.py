"""``python -m vaco``: the ``vaco`` command, for an environment whose scripts are not on the PATH."""

import sys

from vaco.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
