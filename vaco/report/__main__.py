import sys

from vaco.report.cli import main

sys.exit(main())
