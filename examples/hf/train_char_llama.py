"""Train the character Llama (char_llama.py) on tinyshakespeare and write its checkpoint.

    HF_HUB_OFFLINE=1 PYTHONPATH=build/python .venv/bin/python examples/hf/train_char_llama.py \
        --out examples/hf/char_llama --steps 1500 --eval-every 250 --seed 0
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from char_llama import main  # noqa: E402

if __name__ == "__main__":
    main()
