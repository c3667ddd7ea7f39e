import sys

from realtime.cli.main import main

sys.exit(main())
