"""How the reranker turns its passes into scores, as a number (:data:`SCORING_VERSION`).

It grows with every change that moves the scores: a batch checkpoint never resumes old rows beside
new ones, and weights fitted to the scores of another version are warned of where they are applied
(:func:`scores_moved`: only where the kind of score they read moved since they were fitted).
"""

# 1: 2026-12-06, the likelihood prompt drops a passage text's leading whitespace, full-prompt attention on
# sliding-window models reads only the window, sink filtering puts a passage with no content token last.
# 2: 2026-12-07, the likelihood prompt reads a passage's title and text without their edge
# whitespace (it kept a title's, and the text's trailing whitespace).
SCORING_VERSION = 2

# The version in which each kind of LLM score last moved: weights fitted at it or later read the
# scores this attnrank computes (a change of the likelihood alone leaves attention's weights current).
ATTENTION_SINCE = 1
LIKELIHOOD_SINCE = 2


def scores_moved(recorded: int | None, *, attention: bool, likelihood: bool) -> bool:
    """Whether weights fitted at scoring version ``recorded`` (None: weights that record none, not
    checked) read attention or likelihood scores (``attention``, ``likelihood``) that this attnrank
    computes otherwise: they were fitted before that kind last moved, or by a later attnrank."""
    if recorded is None:
        return False
    since = max(ATTENTION_SINCE if attention else 0, LIKELIHOOD_SINCE if likelihood else 0)
    return recorded < since or recorded > SCORING_VERSION
