"""`python -m harness.engine.config`: the README's flag table (see doc.py)."""

import sys

from harness.engine.config.doc import main
from harness.errors import UserError

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        sys.stderr.write(f"{e}\n")
        sys.exit(2)
