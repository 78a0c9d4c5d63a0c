"""How the reranker turns its passes into scores, as a number (:data:`SCORING_VERSION`).

It grows with every change that moves the scores: a batch checkpoint never resumes old rows beside
new ones, and weights fitted to the scores of another version are warned of where they are applied.
"""

# 1: 2026-12-06, the likelihood prompt drops a passage text's leading whitespace, full-prompt attention on
# sliding-window models reads only the window, sink filtering puts a passage with no content token last.
# 2: 2026-12-07, the likelihood prompt reads a passage's title and text without their edge
# whitespace (it kept a title's, and the text's trailing whitespace).
SCORING_VERSION = 2
