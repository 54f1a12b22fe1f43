import sys

from exporter.entry import main

sys.exit(main())
