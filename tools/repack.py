#!/usr/bin/env python3
"""`python tools/repack.py SRC DST [--quantize N]`: the same as `streamer repack`."""

import sys

from streamer.cli import main

if __name__ == "__main__":
    sys.exit(main(["repack", *sys.argv[1:]]))
