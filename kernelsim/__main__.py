import sys

from kernelsim.cli import main

sys.exit(main())
