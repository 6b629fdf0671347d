"""Train a retriever: ``python train.py --config configs/bi_encoder_toollens.yaml [key=value ...]``."""

import sys

from toolgraph.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
