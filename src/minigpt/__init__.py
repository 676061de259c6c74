"""minigpt: a GPT built one chapter at a time (exported from solutions/ by minigpt-export)."""
import coursekit  # noqa: F401  (points tiktoken at the offline GPT-2 files)

from . import tokens
from . import embeddings
from . import attention
from . import transformer
from . import generation
from . import samplers
from . import kv_cache

__all__ = ['tokens', 'embeddings', 'attention', 'transformer', 'generation', 'samplers', 'kv_cache']
