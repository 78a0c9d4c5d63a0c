"""Load and validate corpora (query sets: :mod:`attnrank.queries`).

Formats (chosen by :func:`load_corpus` from the path):

- BEIR folder: ``corpus.jsonl[.gz]`` (``_id``, ``title``, ``text``), ``queries.jsonl``,
  ``qrels/<split>.tsv``.
- JSONL file (``.jsonl`` / ``.jsonl.gz``): one object a line with ``id`` or ``_id``, ``text``,
  optional ``title``; other keys go to ``metadata``, and so do the keys of a ``metadata`` object
  (as an index's ``docs.jsonl`` writes it).
- CSV/TSV file with a header that names ``id`` and ``text`` columns (``title`` optional); other
  columns go to ``metadata`` (as strings).
- In both, the names other tools write are read where attnrank's are absent: ``doc_id`` or
  ``docid`` for the id, ``contents`` (Pyserini), ``body`` or ``passage`` for the text.
- A directory of ``.txt`` / ``.md`` / ``.markdown`` files (hidden ones left out; other files are
  named in a warning): the relative path is the id; a Markdown file whose first line is a heading
  (``# Title``) has it as the title, out of the text; YAML front matter (``---`` lines) is left
  out of the text, and its ``title:`` is the title. One such file given alone is one document,
  its name the id (a file of one passage a line is no corpus of passages: make it a .tsv or .jsonl).

Every problem is reported with file and line. With ``skip_invalid=True`` bad records are
skipped instead, and :class:`LoadReport` says which and why.
"""

from .folders import read_text_dir
from .load import load_corpus
from .report import LoadReport
from .tables import read_csv_corpus, read_jsonl_corpus

__all__ = ["LoadReport", "load_corpus", "read_csv_corpus", "read_jsonl_corpus", "read_text_dir"]
