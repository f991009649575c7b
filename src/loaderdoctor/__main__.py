"""`python -m loaderdoctor`: the same as the `loaderdoctor` command."""

import sys

from loaderdoctor.cli import main

sys.exit(main())
