"""attnrank: retrieval and reranking with a language model's own attention."""
