import sys

from tapa.cli import main

sys.exit(main())
