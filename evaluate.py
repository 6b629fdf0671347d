"""Evaluate a retriever: ``python evaluate.py --config configs/eval/bm25_toollens.yaml [key=value ...] --out DIR``."""

import sys

from toolgraph.cli import main

if __name__ == "__main__":
    sys.exit(main(["evaluate", *sys.argv[1:]]))
