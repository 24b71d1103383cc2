import sys

from kernorch.cli import main

sys.exit(main())
