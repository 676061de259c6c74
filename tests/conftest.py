"""Test-wide settings: offline, with tiktoken reading the course's own copy of GPT-2's files."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Set before anything imports tiktoken or transformers, so no test can reach for the network.
os.environ["TIKTOKEN_CACHE_DIR"] = str(ROOT / "src" / "coursekit" / "data" / "tiktoken")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
