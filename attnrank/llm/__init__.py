"""Language-model loading, prompt construction and attention capture for reranking."""
