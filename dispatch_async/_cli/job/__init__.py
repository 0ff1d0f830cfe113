"""The crash-safe local job: the spec, the journal, the records, ``send``, resume, export.

Imports ``reading`` below it and ``screen``; never ``queued`` or the commands above it.
"""
