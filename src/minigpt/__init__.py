"""minigpt: a GPT built one chapter at a time (exported from solutions/ by minigpt-export).

Import a chapter's module directly: `from minigpt.attention import attention`."""
import coursekit  # noqa: F401  (points tiktoken at the offline GPT-2 files)

# Chapter folder -> module, in course order.
CHAPTERS = {'01-tokens': 'tokens', '02-embeddings': 'embeddings', '03-attention': 'attention', '04-transformer': 'transformer', '05-generation': 'generation', '06-samplers': 'samplers', '07-kv-cache': 'kv_cache', '08-training': 'training', '09-constrained': 'constrained', '10-batching': 'batching'}
