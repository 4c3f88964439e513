import sys

from gaudi_cluster.cli import main

sys.exit(main())
