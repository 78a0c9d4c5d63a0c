"""How the reranker turns its passes into scores, as a number (:data:`SCORING_VERSION`).

It grows with every change that moves the scores: a batch checkpoint never resumes old rows beside
new ones, and weights fitted to the scores of another version are warned of where they are applied.
"""

# 1: 2026-12-06, the likelihood prompt trims a passage's edge whitespace, full-prompt attention on
# sliding-window models reads only the window, sink filtering puts a passage with no content token last.
SCORING_VERSION = 1
