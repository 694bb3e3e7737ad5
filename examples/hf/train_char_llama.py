"""Train the character Llama (char_llama.py) on tinyshakespeare and write its checkpoint.

    python examples/hf/train_char_llama.py --out runs/char_llama --steps 1200 \
        --eval-every 300 --seed 0
    ... --quick    # a smoke run: 10 steps of 8 windows of 64 characters
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from char_llama import main  # noqa: E402

if __name__ == "__main__":
    main()
