"""``attnrank serve``: an HTTP server for reranking, search, pruning and answering (extra ``serve``).

- :mod:`attnrank.serve.app`: the FastAPI app (:func:`~attnrank.serve.app.create_app`) and its error statuses.
- :mod:`attnrank.serve.routes`: the routes; :mod:`attnrank.serve.server`: the limits and job queue they share.
- :mod:`attnrank.serve.schemas`: request/response bodies (Cohere v2 and text-embeddings-inference
  rerank shapes, search/prune/ask) and the request limits.
- :mod:`attnrank.serve.jobs`: the bounded queue in front of the one loaded model.
- :mod:`attnrank.serve.middleware`: the body-size limit and one log line per request.
"""
