"""What the shakespeare scripts share: the data file and torch's thread count."""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "tinyshakespeare.txt")


def setup(threads):
    if threads:
        torch.set_num_threads(threads)
