"""Master, node or user's machine: `python -m gaudi_cluster ROLE`, every role of the image (cli)."""

import sys

from gaudi_cluster.cli import main

sys.exit(main())
