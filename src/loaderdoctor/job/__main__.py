"""`python -m loaderdoctor.job SCRIPT ARGS`: one rank of `loaderdoctor run --nproc-per-node`/`--nnodes`, as torch's
launcher starts it (job/ranks.py). Nothing imports this module, so that runpy runs it fresh."""

import sys

from loaderdoctor.job.onerank import rank_main

sys.exit(rank_main(sys.argv[1:]))
