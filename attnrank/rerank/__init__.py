"""Attention reranking (ICR / QRHead scoring)."""
