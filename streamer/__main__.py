import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while Python starts: no traceback, the usual status
    sys.exit(130)

status = main()
# A KeyboardInterrupt raised inside exec() of source text (dataclasses run one for each method
# they make, so any import can) leaves CPython's "unhandled Ctrl-C" mark set even though main()
# caught it, and `python -m` then ends the process by SIGINT instead of with `status`. An exec()
# of nothing clears that mark.
exec("")
sys.exit(status)
