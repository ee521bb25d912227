import sys

from vaco.report.report_cli import main

sys.exit(main())
