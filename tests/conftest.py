"""Session-wide test settings: offline hub, small vLLM CPU footprint, shared fixture modules."""
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RCDIAG_CACHE_DIR", tempfile.mkdtemp(prefix="rcdiag-test-cache-"))  # never the user's cache

# Fixture modules shared across test folders (tests/fixtures/<area>.py), one line each.
pytest_plugins: list[str] = [
    "tests.fixtures.runs",
    "tests.fixtures.engine",
]
