import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while Python starts: no traceback, the usual status
    sys.exit(130)

sys.exit(main())
