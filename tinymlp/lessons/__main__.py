"""``python -m tinymlp.lessons notebooks...``: grade a class's notebooks (see grader.py)."""

import sys

from .grader import main

sys.exit(main())
