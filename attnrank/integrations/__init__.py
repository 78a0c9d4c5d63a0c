"""Adapters that put attnrank inside other frameworks (entry-point layer).

- :mod:`attnrank.integrations.langchain`: retriever, reranking and pruning compressors
  (extra ``langchain``).
- :mod:`attnrank.integrations.llamaindex`: retriever, reranking and pruning node postprocessors
  (extra ``llamaindex``).
- Haystack components live in the namespace package ``haystack_integrations`` (extra ``haystack``):
  ``haystack_integrations.components.rankers.attnrank`` and ``…retrievers.attnrank``.

The LangChain and LlamaIndex adapters take either a built
:class:`~attnrank.rerank.attention.AttentionReranker` / :class:`~attnrank.prune.pruner.ContextPruner`
or the keyword arguments of its constructor; the Haystack components take settings only (a pipeline
is saved as YAML of basic types). Adapters built from the same arguments share one object (and so
one loaded model), see :mod:`attnrank.integrations.shared`; what they do to the frameworks'
documents and arguments is :mod:`attnrank.integrations.documents`.
"""
